"""The client of a raw-bytes gRPC service (``rendezvous.net.rpc``): ``RpcClient``, and
the typed error for a failed call (``translate_rpc_error``).

Errors: a handler that raises an ``ElasticError`` subclass is re-raised here as the
same class (by registered name); a request that does not parse is
``MalformedRequest``. Transport failures become ``RendezvousConnectionError``; a refused
secret becomes ``RendezvousAuthError``, a proof refused as made for another incarnation
of the server ``StaleIncarnationError`` (nothing ran: the call may be repeated).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rendezvous.errors import (
    ElasticError,
    NotSentError,
    RendezvousAuthError,
    RendezvousConnectionError,
    RendezvousError,
    StaleIncarnationError,
    error_class,
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

CLIENT_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    # A client is a connection of its own. gRPC otherwise shares one connection among
    # every channel of a process to the same address, and the server's per-connection
    # stream limit (``ServerLimits.max_streams_per_connection``) then counts the open
    # watches and calls of all of them together: past it, any client's next call waits
    # for another's stream to end (a driver's health probe behind its own watches).
    ("grpc.use_local_subchannel_pool", 1),
    # A connection refused (a server at its connection cap while strangers hold it, a
    # shard restarting) is tried again within a second or two, not after gRPC's default
    # backoff that grows to two minutes: the client is back as soon as there is room.
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def _refused_incarnation(exc: grpc.RpcError) -> bool:
    """Whether the server refused the call's proof as made for another incarnation."""
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return dict(trailers or ()).get(REFUSED_KEY) == REFUSED_INCARNATION


def translate_rpc_error(exc: grpc.RpcError, what: str) -> ElasticError:
    """The typed error for a failed call (``what`` names the target for the message)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    if code == grpc.StatusCode.FAILED_PRECONDITION and ERROR_SEPARATOR in details:
        name, message = details.split(ERROR_SEPARATOR, 1)
        cls = error_class(name) or RendezvousError
        return cls(message)
    if code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details.lower():
        return NotSentError(f"{what}: unavailable: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        if _refused_incarnation(exc):
            return StaleIncarnationError(f"{what}: {details}")
        return RendezvousAuthError(f"{what}: {details}")
    if code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    ):
        return RendezvousConnectionError(f"{what}: {code.name.lower()}: {details}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return MalformedRequest(f"{what}: {details}")
    return RendezvousError(f"{what}: {code.name if code else 'error'}: {details}")


class RpcClient:
    """Calls one ``RpcServer`` service; every call has a deadline and carries the secret proof.

    Proofs are made for the server process's ``incarnation``. Given (read where the
    address was: a ps shard's record), a proof the server refuses as made for another
    is ``StaleIncarnationError``: the caller reads the record again. None: it is asked
    of the server before the first call, and asked again when the server refuses a call
    that way (the process at the address restarted): that call, which never ran, is
    then repeated once at once."""

    def __init__(
        self,
        address: str,
        service: str,
        secret: str,
        timeout: float = 10.0,
        incarnation: str | None = None,
    ):
        self.address = address
        self.service = service
        self.timeout = timeout
        self._secret = secret
        self._channel = grpc.insecure_channel(address, options=CLIENT_OPTIONS)
        self._lock = threading.Lock()
        self._unary: dict[str, Callable] = {}
        self._stream: dict[str, Callable] = {}
        self._asks = incarnation is None  # it learns the incarnation from the server
        self._incarnation = incarnation

    def _method(self, table: dict, kind: str, name: str):
        with self._lock:
            if name not in table:
                factory = getattr(self._channel, kind)
                table[name] = factory(f"/{self.service}/{name}")
            return table[name]

    def incarnation(self, timeout: float | None = None, wait_for_ready: bool = False) -> str:
        """The incarnation of the server this client's proofs are made for: the one
        given, else the one the server said (asked now when not known yet).

        Raises:
            RendezvousConnectionError: the server did not answer within ``timeout``.
            RendezvousError: its answer is no incarnation (a server of an older release)."""
        with self._lock:
            known = self._incarnation
        if known is not None:
            return known
        method = self._method(self._unary, "unary_unary", INCARNATION_METHOD)
        try:
            reply = method(
                b"",
                timeout=self.timeout if timeout is None else timeout,
                wait_for_ready=wait_for_ready,
            )
        except grpc.RpcError as exc:
            raise translate_rpc_error(exc, f"{self.service} at {self.address}") from None
        told = bytes(reply).decode("ascii", "replace")
        if not auth.is_incarnation(told):
            raise RendezvousError(
                f"{self.service} at {self.address} answered no incarnation: {told[:40]!r}"
            )
        with self._lock:
            self._incarnation = told
        return told

    def translate(self, exc: grpc.RpcError, what: str) -> ElasticError:
        """``translate_rpc_error``; a client that asks the server for its incarnation
        forgets the one the server refused, so that its next call asks again."""
        error = translate_rpc_error(exc, what)
        if isinstance(error, StaleIncarnationError) and self._asks:
            with self._lock:
                self._incarnation = None
        return error

    def _proof(self, name: str, payload: bytes, incarnation: str):
        return auth.call_metadata(self._secret, f"/{self.service}/{name}", payload, incarnation)

    def call(
        self, name: str, payload: bytes, timeout: float | None = None, wait_for_ready: bool = False
    ) -> bytes:
        """One unary call, within ``timeout`` (default: the client's) in all.

        Raises:
            ElasticError: the handler's typed error.
            StaleIncarnationError: the server is another process than the incarnation
                given (nothing ran: read its record again and repeat).
            RendezvousAuthError: the server refused the secret.
            RendezvousConnectionError: unreachable, or past the deadline."""
        method = self._method(self._unary, "unary_unary", name)
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        what = f"{self.service}.{name} at {self.address}"
        attempts = 2 if self._asks else 1
        while True:
            attempts -= 1
            incarnation = self.incarnation(max(deadline - time.monotonic(), 0.0), wait_for_ready)
            try:
                return method(
                    payload,
                    timeout=max(deadline - time.monotonic(), 0.0),
                    metadata=self._proof(name, payload, incarnation),
                    wait_for_ready=wait_for_ready,
                )
            except grpc.RpcError as exc:
                error = self.translate(exc, what)
                if attempts == 0 or not isinstance(error, StaleIncarnationError):
                    raise error from None

    def stream(self, name: str, payload: bytes, timeout: float | None = None):
        """A server stream: returns the gRPC call object (iterate it; ``cancel()`` ends it).
        Iteration raises ``grpc.RpcError``; pass it to ``translate``.

        Raises:
            RendezvousConnectionError: the server's incarnation was to be asked, and the
                server did not answer within the client's timeout."""
        method = self._method(self._stream, "unary_stream", name)
        incarnation = self.incarnation()
        return method(payload, timeout=timeout, metadata=self._proof(name, payload, incarnation))

    def close(self) -> None:
        self._channel.close()
