"""Raw-bytes gRPC services with job-secret checks, shared by the embedded store and ps shards.

No protobuf: handlers take and return ``bytes`` (gRPC generic handlers with identity
serializers), so large tensors travel without per-element encoding and the project's
services never touch the protobuf runtime that etcd's client needs in pure-Python mode.

Serving. ``RpcServer`` runs gRPC's asyncio server on an event loop thread of its own:
a call costs a coroutine, not a thread, while it waits for its message, so clients
that open calls and never send a body (or send it slowly) hold no thread and starve
nobody. Every call is checked before its body is read: the router sees the method and
the metadata first and answers a call without a valid proof of the job secret with
UNAUTHENTICATED at once, through a handler that never reads the request. A proof is
made for one server process: each ``RpcServer`` draws a fresh incarnation when it is
made (``rendezvous.net.auth``), and refuses a proof made for another with
UNAUTHENTICATED and a trailer that says so, which the client raises as
``StaleIncarnationError`` (nothing ran: the call may be repeated). A client learns the
incarnation where it learns the address (a ps shard's record), or, given none, asks the
server for it (``INCARNATION_METHOD``, answered without a proof: an incarnation is no
secret, only what a proof is made for) and asks again after such a refusal. Messages are
bounded (``ServerLimits.max_message_bytes``; gRPC refuses a larger one from its length
prefix, before buffering it), and so are concurrent streams per connection. So are the
connections (``ServerLimits``): their number, kept below the process's descriptor limit,
and their life, so a peer that makes no call holds its connection for seconds and one
that makes only refused calls for minutes at most; the memory a flood of refused calls
leaves behind is handed back once it is over. A handler that may block
(``add_unary(..., blocking=True)``, the default) runs on a bounded thread
pool; a quick one runs on the loop itself. Stream handlers are async generators.

Errors: a handler that raises an ``ElasticError`` subclass is re-raised on the client
as the same class (by registered name). A request that does not parse (a client with
the secret but a bug) gets INVALID_ARGUMENT with one line, and the server logs one
line, never a traceback per call. Transport failures become ``RendezvousConnectionError``;
a refused secret becomes ``RendezvousAuthError``, a proof refused as made for another
incarnation ``StaleIncarnationError`` (the client: ``rendezvous.net.rpc_client``).
``frame``/``unframe`` pack a JSON header and binary blobs into one message
(``rendezvous.net.rpc_wire``, what both ends agree on).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent import futures
from dataclasses import dataclass

from rendezvous.errors import (
    ElasticError,
    RendezvousError,
)
from rendezvous.net import auth
from rendezvous.net.grpc_runtime import grpc
from rendezvous.net.rpc_wire import (
    ERROR_SEPARATOR,
    INCARNATION_METHOD,
    REFUSED_INCARNATION,
    REFUSED_KEY,
    MalformedRequest,
)
from rendezvous.net.url import Endpoint
from rendezvous.rate_log import RateLimitedLog
from rendezvous.resources import connection_cap, release_free_memory

log = logging.getLogger(__name__)

#: seconds between log lines about refused or malformed calls (one line, not one per call)
_REFUSAL_LOG_INTERVAL = 10.0
#: refused calls in one burst after which the memory they held is handed back to the
#: system once the burst is over (``rendezvous.resources``); fewer leave too little
#: behind to be worth it
_FLOOD_CALLS = 256
#: seconds without a refused call that end a burst
_FLOOD_QUIET = 2.0

UnaryHandler = Callable[[bytes], bytes]
StreamHandler = Callable[[bytes, "grpc.aio.ServicerContext"], AsyncIterator[bytes]]


@dataclass(frozen=True)
class ServerLimits:
    """Bounds an ``RpcServer`` keeps whatever its clients do.

    Calls. ``max_message_bytes``: the largest request accepted (protocol messages are
    small: tensors travel in pieces or on the bulk channel). ``max_metadata_bytes``: the
    largest header block of a call (a proof is about 150 bytes).
    ``max_streams_per_connection``: concurrent calls one connection may hold.
    ``max_workers``: threads for blocking handlers (calls beyond wait as coroutines, not
    threads). ``max_pending_calls``: calls arrived but not yet taken up by the event
    loop; gRPC's default (1000, with random early drops up to 3000) cancels calls when
    thousands of workers call at once (a round change), so it is raised well above the
    job sizes the store serves. The pending calls are also what a flood of refused calls
    holds at its peak (about 15 KiB each here): they bound its memory.

    Connections (gRPC has no "unauthenticated connection": these hold for every peer,
    and a job's own clients reconnect on their next call, within a round trip).
    ``max_connections``: connections held at once (a job's clients hold one or two
    each: 4096 workers fit); gRPC closes one more as it accepts it, and at start the
    cap is lowered to a share of the process's descriptor limit
    (``rendezvous.resources.connection_cap``), so a flood of connections never takes
    the descriptors the process needs. ``handshake_timeout``: seconds a new connection
    may take to start speaking HTTP/2. ``idle_timeout``: a connection with no call for
    that long is closed (one whose calls were all refused is idle once they are
    answered, and goes within about twice that). ``max_connection_age``: every
    connection is asked to go away (HTTP/2 GOAWAY) after that long, so one kept busy
    with refused calls is out too; its client's next calls open a fresh connection
    while its calls in flight finish, for up to ``age_grace`` seconds (more than any
    call of the job takes; a watch cut then resumes where it was). Minutes, not
    seconds: a stranger reconnects at no cost, so a shorter age would not lower what
    strangers hold (the cap does), and every client of the job would reconnect more
    often, each time while a flood fills the cap waiting for room."""

    max_message_bytes: int = 4 << 20
    max_metadata_bytes: int = 8 << 10
    max_streams_per_connection: int = 128
    max_workers: int = 64
    max_pending_calls: int = 20_000
    max_connections: int = 16384
    handshake_timeout: float = 10.0
    idle_timeout: float = 5.0
    max_connection_age: float = 300.0
    age_grace: float = 300.0

    def __post_init__(self):
        if (
            self.max_message_bytes < 1024
            or self.max_metadata_bytes < 1024
            or self.max_streams_per_connection < 1
            or self.max_workers < 1
            or self.max_connections < 1
            or not self.handshake_timeout > 0
            or not self.idle_timeout > 0
            or not self.max_connection_age > 0
            or not self.age_grace > 0
        ):
            raise ValueError(f"unusable server limits: {self}")

    def grpc_options(self) -> list[tuple[str, int]]:
        """gRPC's server arguments for these limits, the connection cap as it stands
        against the process's descriptor limit now."""
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.max_metadata_size", self.max_metadata_bytes),
            ("grpc.max_concurrent_streams", self.max_streams_per_connection),
            ("grpc.server.max_pending_requests", self.max_pending_calls),
            ("grpc.server.max_pending_requests_hard_limit", 2 * self.max_pending_calls),
            ("grpc.max_allowed_incoming_connections", connection_cap(self.max_connections)),
            ("grpc.server_handshake_timeout_ms", _ms(self.handshake_timeout)),
            ("grpc.max_connection_idle_ms", _ms(self.idle_timeout)),
            ("grpc.max_connection_age_ms", _ms(self.max_connection_age)),
            ("grpc.max_connection_age_grace_ms", _ms(self.age_grace)),
        ]


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    if isinstance(exc, MalformedRequest):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, ElasticError):
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION, f"{type(exc).__name__}{ERROR_SEPARATOR}{exc}"
        )
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {type(exc).__name__}: {exc}"
    )


class _Router(grpc.GenericRpcHandler):
    """Chooses each call's handler from its method and metadata, before any body is read."""

    def __init__(self, server: RpcServer):
        self._server = server

    def service(self, handler_call_details):
        method = handler_call_details.method
        if method == self._server._incarnation_method:
            return self._server._incarnation_handler
        handler = self._server._handlers.get(method)
        if handler is None:
            self._server._refused()
            return None  # gRPC answers UNIMPLEMENTED
        token = dict(handler_call_details.invocation_metadata or ()).get(auth.RPC_METADATA_KEY)
        try:
            self._server._verifier.check_head(method, token)
        except auth.ProofRefused as exc:
            self._server._refused()
            kind = "incarnation" if isinstance(exc, auth.OtherIncarnation) else "auth"
            self._server._refusals.warn(kind, f"refused a call of {method}: {exc}")
            reason = f"request refused: {exc}"
            # A proof for another incarnation is said in a trailer too: the client takes
            # it for "ask which process serves here, and repeat", not for a wrong secret.
            trailer = ((REFUSED_KEY, REFUSED_INCARNATION),) if kind == "incarnation" else ()

            async def deny(_requests, context):  # never reads the request
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason, trailer)

            if handler.response_streaming:
                return grpc.stream_stream_rpc_method_handler(deny)
            return grpc.stream_unary_rpc_method_handler(deny)
        return handler


class RpcServer:
    """A gRPC server for one service name whose methods take and return bytes.

    Register handlers with ``add_unary``/``add_stream`` before ``start``. Calls must
    prove the secret for this server's ``incarnation``: a fresh one unless given, and
    never one a server before it had (a server that publishes a record of itself names
    it there, as a ps shard does).

    Raises:
        ValueError: ``incarnation`` is not spelt as one (``auth.is_incarnation``)."""

    def __init__(
        self,
        service: str,
        secret: str,
        bind: str = "127.0.0.1:0",
        limits: ServerLimits | None = None,
        incarnation: str | None = None,
    ):
        self.service = service
        self._bind = bind
        self._limits = limits or ServerLimits()
        self.incarnation = incarnation or auth.new_incarnation()
        self._verifier = auth.CallVerifier(secret, self.incarnation)
        self._incarnation_method = f"/{service}/{INCARNATION_METHOD}"
        told = self.incarnation.encode()

        async def tell(_requests, _context) -> bytes:  # never reads the request
            return told

        self._incarnation_handler = grpc.stream_unary_rpc_method_handler(tell)
        self._refusals = RateLimitedLog(_REFUSAL_LOG_INTERVAL, log)
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._pool: futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: grpc.aio.Server | None = None
        self._thread: threading.Thread | None = None
        self.address: str | None = None
        # the burst of refused calls under way (see _refused); touched on the loop only
        self._burst_refusals = 0
        self._last_refusal = 0.0
        self._burst_timer: asyncio.TimerHandle | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The server's event loop (for handlers that wake stream handlers from threads)."""
        return self._loop

    def _refused(self) -> None:
        """Count a refused call (on the loop). The first of a burst arms a timer that
        fires once no call has been refused for ``_FLOOD_QUIET`` seconds: a timer per
        burst, not per call, and none while nobody is refused."""
        loop = self._loop
        if loop is None:
            return
        self._burst_refusals += 1
        self._last_refusal = loop.time()
        if self._burst_timer is None:
            self._burst_timer = loop.call_later(_FLOOD_QUIET, self._burst_over)

    def _burst_over(self) -> None:
        loop, pool = self._loop, self._pool
        assert loop is not None  # the timer runs on it
        quiet_at = self._last_refusal + _FLOOD_QUIET
        if loop.time() < quiet_at:  # refused calls still coming: look again then
            self._burst_timer = loop.call_at(quiet_at, self._burst_over)
            return
        self._burst_timer = None
        refused, self._burst_refusals = self._burst_refusals, 0
        if refused >= _FLOOD_CALLS and pool is not None:
            # The calls are freed, but the allocator keeps the pages at the flood's peak.
            # On the pool: trimming a large heap takes milliseconds the loop should not.
            log.info("%s: %d calls refused; handing freed memory back", self.service, refused)
            pool.submit(release_free_memory)

    def _check_body(self, context, request: bytes) -> None:
        metadata = dict(context.invocation_metadata() or ())
        token = metadata.get(auth.RPC_METADATA_KEY, "")
        try:
            self._verifier.check_body(token.split(".")[1], request, metadata.get(auth.RPC_BODY_KEY))
        except (auth.ProofRefused, IndexError) as exc:
            raise _BodyRefused(str(exc)) from None

    def _check_name(self, name: str) -> None:
        if name == INCARNATION_METHOD:
            raise ValueError(f"{INCARNATION_METHOD!r} is answered by every RpcServer itself")

    def add_unary(self, name: str, fn: UnaryHandler, *, blocking: bool = True) -> None:
        """Serve ``fn(request) -> reply``. ``blocking`` handlers run on the thread pool;
        others (quick, never waiting) run on the event loop itself.

        Raises:
            ValueError: ``name`` is ``INCARNATION_METHOD``."""
        self._check_name(name)

        async def handler(request: bytes, context):
            try:
                self._check_body(context, request)
                if blocking:
                    return await asyncio.get_running_loop().run_in_executor(self._pool, fn, request)
                return fn(request)
            except _BodyRefused as exc:
                self._refused()
                self._refusals.warn("auth", f"refused a call of {name}: {exc}")
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"request refused: {exc}")
            except ElasticError as exc:
                if isinstance(exc, MalformedRequest):
                    self._refusals.warn("malformed", f"malformed {name} request: {exc}")
                await _abort(context, exc)
            except (KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
                self._refusals.warn("malformed", f"malformed {name} request: {exc!r}")
                await _abort(context, exc)

        self._handlers[f"/{self.service}/{name}"] = grpc.unary_unary_rpc_method_handler(handler)

    def add_stream(self, name: str, fn: StreamHandler) -> None:
        """Serve ``fn(request, context)``, an async generator of replies (it runs on the
        event loop: it must await, never block).

        Raises:
            ValueError: ``name`` is ``INCARNATION_METHOD``."""
        self._check_name(name)

        async def handler(request: bytes, context):
            try:
                self._check_body(context, request)
                async for reply in fn(request, context):
                    yield reply
            except _BodyRefused as exc:
                self._refused()
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"request refused: {exc}")
            except ElasticError as exc:
                await _abort(context, exc)
            except (KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
                self._refusals.warn("malformed", f"malformed {name} request: {exc!r}")
                await _abort(context, exc)

        self._handlers[f"/{self.service}/{name}"] = grpc.unary_stream_rpc_method_handler(handler)

    def start(self, timeout: float = 10.0) -> str:
        """Bind and serve; returns ``host:port`` (the real port when ``bind`` asked for 0).

        Raises:
            RendezvousError: the address cannot be bound (the message names it)."""
        bind = Endpoint.parse(self._bind, f"{self.service} bind address", allow_port_zero=True)
        self._pool = futures.ThreadPoolExecutor(
            max_workers=self._limits.max_workers, thread_name_prefix=f"rpc-{self.service}"
        )
        started: futures.Future[int] = futures.Future()
        self._thread = threading.Thread(
            target=self._serve, args=(started,), daemon=True, name=f"rpc-{self.service}"
        )
        self._thread.start()
        try:
            port = started.result(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        self.address = str(Endpoint(bind.host, port))
        return self.address

    def _serve(self, started: futures.Future) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            loop.run_until_complete(self._start(started))
        except BaseException as exc:  # noqa: BLE001  (reported to start(), which raises it)
            if not started.done():
                started.set_exception(exc)
        if started.exception() is None:
            loop.run_forever()
        # Calls the server's stop left behind (a stream waiting for news) end here, before
        # the loop closes: cancelled and awaited, so none is destroyed while pending.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    async def _start(self, started: futures.Future) -> None:
        server = grpc.aio.server(options=self._limits.grpc_options())
        server.add_generic_rpc_handlers([_Router(self)])
        try:
            port = server.add_insecure_port(self._bind)
        except RuntimeError as exc:
            raise RendezvousError(f"cannot bind {self.service} to {self._bind}: {exc}") from exc
        if port == 0:
            raise RendezvousError(f"cannot bind {self.service} to {self._bind}")
        await server.start()
        self._server = server
        started.set_result(port)

    def stop(self, grace: float | None = 0.5) -> None:
        """End every call (after ``grace`` seconds for those running) and the loop thread."""
        loop, server, self._server = self._loop, self._server, None
        if loop is not None and loop.is_running():
            if server is not None:
                done = asyncio.run_coroutine_threadsafe(server.stop(grace), loop)
                try:
                    done.result(timeout=(grace or 0) + 5)
                except (futures.TimeoutError, RuntimeError) as exc:
                    log.debug("stopping %s: %s", self.service, exc)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class _BodyRefused(Exception):
    """Internal: the body proof of an otherwise authenticated call failed."""
