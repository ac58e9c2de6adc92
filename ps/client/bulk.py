"""The client's side of a shard's bulk port: payload parts over plain TCP (protocol and
reasons: ``ps.bulk``)."""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from elastic.netio import client_handshake, make_nonce, recv_exact_into
from ps.bulk import CLIENT_IDLE, HANDSHAKE, MAGIC, recv_json, send_json
from ps.errors import PSTransferError
from ps.protocol import GET, PUT, Part
from rendezvous.errors import RendezvousConnectionError, error_class
from rendezvous.net.url import Endpoint


class BulkClient:
    """Authenticated connections to one shard's bulk port at ``address`` (HOST:PORT),
    used one request at a time each (at most ``lanes`` at once).

    Raises:
        RendezvousConfigError: ``address`` is not HOST:PORT."""

    def __init__(self, address: str, secret: str, lanes: int, timeout: float):
        self.address = address
        self._target = Endpoint.parse(address, "ps bulk address").sockaddr
        self._secret = secret
        self._timeout = timeout
        self._idle: queue.LifoQueue = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(lanes)
        self._all: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False

    def _connect(self) -> socket.socket:
        try:
            sock = socket.create_connection(self._target, timeout=self._timeout)
        except OSError as exc:
            raise RendezvousConnectionError(f"ps bulk port {self.address}: {exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client_handshake(
                sock,
                self._secret,
                MAGIC + make_nonce(),
                HANDSHAKE,
                deadline=time.monotonic() + self._timeout,
                peer=f"ps bulk port {self.address}",
            )
        except (OSError, ConnectionError) as exc:
            sock.close()
            raise RendezvousConnectionError(
                f"ps bulk handshake with {self.address}: {exc}"
            ) from None
        except BaseException:
            sock.close()
            raise
        with self._lock:
            self._all.append(sock)
        return sock

    def _call(self, header: dict, send=(), receive=()) -> None:
        """One request: send ``send`` pieces after the header, receive the reply's bytes
        into the ``receive`` views.

        Raises:
            RendezvousConnectionError: a broken or slow connection (the caller retries
                the operation).
            RendezvousAuthError: the port does not know the job secret.
            PSError: the shard's typed error (e.g. PSTransferError, staging expired)."""
        if not self._slots.acquire(timeout=self._timeout):
            raise RendezvousConnectionError(f"no free bulk connection to {self.address}")
        sock = None
        try:
            while sock is None:
                try:
                    sock, last_used = self._idle.get_nowait()
                except queue.Empty:
                    sock = self._connect()
                    break
                if time.monotonic() - last_used > CLIENT_IDLE:  # the shard may have closed it
                    self._drop(sock)
                    sock = None
            try:
                sock.settimeout(self._timeout)
                send_json(sock, header)
                for piece in send:
                    sock.sendall(piece)
                reply = recv_json(sock)
                if "error" in reply:
                    cls = error_class(reply["error"]) or PSTransferError
                    raise cls(reply.get("message", ""))
                for view in receive:
                    recv_exact_into(sock, view)
            except (OSError, ConnectionError, ValueError) as exc:
                self._drop(sock)
                sock = None
                raise RendezvousConnectionError(
                    f"ps bulk transfer with {self.address}: {exc}"
                ) from None
            except BaseException:
                self._drop(sock)  # the stream may be mid-message: never reuse it
                sock = None
                raise
            self._idle.put((sock, time.monotonic()))
            sock = None
        finally:
            self._slots.release()

    def put(self, part: Part, pieces: Sequence[memoryview]) -> None:
        """Send ``part`` of an upload from ``pieces``. Raises what ``_call`` raises."""
        self._call(replace(part, op=PUT).to_dict(), send=pieces)

    def get(self, part: Part, views: Sequence[memoryview]) -> None:
        """Receive ``part`` of a download into ``views``. Raises what ``_call`` raises."""
        self._call(replace(part, op=GET).to_dict(), receive=views)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            if sock in self._all:
                self._all.remove(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def close(self) -> None:
        with self._lock:
            socks, self._all = self._all, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
