"""Raw-bytes gRPC services with job-secret checks, shared by the embedded store and ps shards.

No protobuf: handlers take and return ``bytes`` (gRPC generic handlers with identity
serializers), so large tensors travel without per-element encoding and the project's
services never touch the protobuf runtime that etcd's client needs in pure-Python mode.

Errors: a handler that raises an ``ElasticError`` subclass is re-raised on the client
as the same class (by registered name). Transport failures become
``RendezvousConnectionError``; a refused secret becomes ``RendezvousAuthError``.
``frame``/``unframe`` pack a JSON header and binary blobs into one message.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterable
from concurrent import futures
from typing import Callable

import grpc

from rendezvous import auth
from rendezvous.errors import (
    ElasticError,
    NotSentError,
    RendezvousAuthError,
    RendezvousConnectionError,
    RendezvousError,
    error_class,
)

UNLIMITED_MESSAGE_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]
_ERROR_SEPARATOR = "|"
_identity = None  # gRPC passes bytes through when (de)serializers are None

UnaryHandler = Callable[[bytes], bytes]
StreamHandler = Callable[[bytes, "grpc.ServicerContext"], Iterable[bytes]]


def frame(header: dict, blobs: Iterable[bytes | memoryview] = ()) -> bytes:
    """One message: 4-byte header length, the JSON header, then the blobs back to back.

    The header should say how long each blob is (the caller's schema decides how)."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([struct.pack("!I", len(head)), head, *blobs])


def unframe(message: bytes) -> tuple[dict, memoryview]:
    """Inverse of ``frame``: the header and a zero-copy view of the blob bytes."""
    view = memoryview(message)
    (head_len,) = struct.unpack_from("!I", view, 0)
    header = json.loads(bytes(view[4 : 4 + head_len]))
    return header, view[4 + head_len :]


class _AuthInterceptor(grpc.ServerInterceptor):
    """Refuses any call that does not carry proof of the job secret."""

    def __init__(self, secret: str):
        self._secret = secret

        def deny(request, context):
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "request refused: missing or wrong job secret"
            )

        self._deny_unary = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.unary_stream_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        token = dict(handler_call_details.invocation_metadata or ()).get(auth.RPC_METADATA_KEY)
        if auth.check_rpc_token(self._secret, token):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is not None and handler.response_streaming:
            return self._deny_stream
        return self._deny_unary


def _abort_with(context, exc: ElasticError):
    context.abort(
        grpc.StatusCode.FAILED_PRECONDITION, f"{type(exc).__name__}{_ERROR_SEPARATOR}{exc}"
    )


class RpcServer:
    """A gRPC server for one service name whose methods take and return bytes.

    Register handlers with ``add_unary``/``add_stream`` before ``start``."""

    def __init__(self, service: str, secret: str, bind: str = "127.0.0.1:0", max_workers: int = 64):
        self.service = service
        self._bind = bind
        self._secret = secret
        self._max_workers = max_workers
        self._methods: dict[str, grpc.RpcMethodHandler] = {}
        self._server: grpc.Server | None = None
        self.address: str | None = None

    def add_unary(self, name: str, fn: UnaryHandler) -> None:
        def handler(request: bytes, context):
            try:
                return fn(request)
            except ElasticError as exc:
                _abort_with(context, exc)

        self._methods[name] = grpc.unary_unary_rpc_method_handler(handler)

    def add_stream(self, name: str, fn: StreamHandler) -> None:
        def handler(request: bytes, context):
            try:
                yield from fn(request, context)
            except ElasticError as exc:
                _abort_with(context, exc)

        self._methods[name] = grpc.unary_stream_rpc_method_handler(handler)

    def start(self) -> str:
        """Bind and serve; returns ``host:port`` (the real port when ``bind`` asked for 0).

        Raises RendezvousConfigError-free OSError-like ``RendezvousError`` if the bind fails."""
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers),
            interceptors=[_AuthInterceptor(self._secret)],
            options=UNLIMITED_MESSAGE_OPTIONS,
        )
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler(self.service, self._methods)]
        )
        host = self._bind.rsplit(":", 1)[0]
        try:
            port = server.add_insecure_port(self._bind)
        except RuntimeError as exc:
            raise RendezvousError(f"cannot bind {self.service} to {self._bind}: {exc}") from exc
        if port == 0:
            raise RendezvousError(f"cannot bind {self.service} to {self._bind}")
        server.start()
        self._server = server
        self.address = f"{host}:{port}"
        return self.address

    def stop(self, grace: float | None = 0.5) -> None:
        if self._server is not None:
            self._server.stop(grace).wait(timeout=(grace or 0) + 5)
            self._server = None


def translate_rpc_error(exc: grpc.RpcError, what: str) -> ElasticError:
    """The typed error for a failed call (``what`` names the target for the message)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    if code == grpc.StatusCode.FAILED_PRECONDITION and _ERROR_SEPARATOR in details:
        name, message = details.split(_ERROR_SEPARATOR, 1)
        cls = error_class(name) or RendezvousError
        return cls(message)
    if code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details.lower():
        return NotSentError(f"{what}: unavailable: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return RendezvousAuthError(f"{what}: {details}")
    if code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    ):
        return RendezvousConnectionError(f"{what}: {code.name.lower()}: {details}")
    return RendezvousError(f"{what}: {code.name if code else 'error'}: {details}")


class RpcClient:
    """Calls one ``RpcServer`` service; every call has a deadline and carries the secret proof."""

    def __init__(self, address: str, service: str, secret: str, timeout: float = 10.0):
        self.address = address
        self.service = service
        self.timeout = timeout
        self._metadata = ((auth.RPC_METADATA_KEY, auth.rpc_token(secret)),)
        self._channel = grpc.insecure_channel(address, options=UNLIMITED_MESSAGE_OPTIONS)
        self._lock = threading.Lock()
        self._unary: dict[str, Callable] = {}
        self._stream: dict[str, Callable] = {}

    def _method(self, table: dict, kind: str, name: str):
        with self._lock:
            if name not in table:
                factory = getattr(self._channel, kind)
                table[name] = factory(f"/{self.service}/{name}")
            return table[name]

    def call(
        self, name: str, payload: bytes, timeout: float | None = None, wait_for_ready: bool = False
    ) -> bytes:
        """One unary call. Raises the handler's typed error, RendezvousAuthError or
        RendezvousConnectionError (unreachable or past the deadline)."""
        method = self._method(self._unary, "unary_unary", name)
        try:
            return method(
                payload,
                timeout=timeout if timeout is not None else self.timeout,
                metadata=self._metadata,
                wait_for_ready=wait_for_ready,
            )
        except grpc.RpcError as exc:
            raise translate_rpc_error(exc, f"{self.service}.{name} at {self.address}") from None

    def stream(self, name: str, payload: bytes, timeout: float | None = None):
        """A server stream: returns the gRPC call object (iterate it; ``cancel()`` ends it).
        Iteration raises ``grpc.RpcError``; pass it to ``translate_rpc_error``."""
        method = self._method(self._stream, "unary_stream", name)
        return method(payload, timeout=timeout, metadata=self._metadata)

    def close(self) -> None:
        self._channel.close()
