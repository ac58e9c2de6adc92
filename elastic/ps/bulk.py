"""Chunk bytes over plain TCP, next to the gRPC service (the "bulk" plane).

Every request still goes through gRPC, where the job secret is checked on every call;
only the bytes of ``Upload``/``Download`` parts may travel here instead. The reason is
measured, not assumed: on loopback gRPC Python moves a 64 MiB push+pull at about a
third of what a plain socket does, even in 8 MiB parts over 4 connections with nothing
else to do (benchmarks/ps_bench.py, ``--no-bulk``), because every message is copied
through HTTP/2 frames in Python-owned buffers. Here the client sends straight from the
gradient arrays and receives straight into the result arrays, and the shard receives
into its staging buffer and sends from the parameter arrays.

Connections are authenticated both ways by challenge/response with the job secret
(``rendezvous.auth``; like ring peers) before any request is read:

    client: MAGIC, client nonce        shard: shard nonce, HMAC(secret, "shard" + client nonce)
    client: HMAC(secret, "client" + shard nonce)

Then requests, one at a time per connection: 4-byte length + JSON header, and for
``put`` the part's bytes; the reply is 4-byte length + JSON, and for ``get`` the part's
bytes. A shard error comes back as ``{"error": class name, "message": ...}`` and is
raised as that class.
"""
from __future__ import annotations

import json
import logging
import queue
import socket
import struct
import threading
import time

from elastic.ps.errors import PSTransferError
from rendezvous import auth
from rendezvous.errors import ElasticError, RendezvousAuthError, RendezvousConnectionError, error_class

log = logging.getLogger("elastic.ps.bulk")

MAGIC = b"EPSBULK1"
_SHARD, _CLIENT = b"ps-bulk-shard", b"ps-bulk-client"
_LEN = struct.Struct("!I")
_MAX_HEADER = 1 << 20
# A connection idle this long is closed by the shard (a client that vanished without
# closing it would otherwise hold a thread forever); clients drop theirs earlier.
SERVER_IDLE = 600.0
CLIENT_IDLE = 300.0


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    view = view.cast("B")
    got = 0
    while got < view.nbytes:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("connection closed by peer")
        got += n


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return bytes(buf)


def _send_json(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_json(sock: socket.socket) -> dict:
    (n,) = _LEN.unpack(_recv(sock, _LEN.size))
    if n > _MAX_HEADER:
        raise ConnectionError(f"header of {n} bytes")
    return json.loads(_recv(sock, n))


class BulkServer:
    """The shard's bulk listener; parts go to/come from ``staging`` (transport.Staging)."""

    def __init__(self, secret: str, host: str, staging, io_timeout: float = 60.0):
        self._secret = secret
        self._staging = staging
        self._io_timeout = io_timeout
        self._sock = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host
                                          else socket.AF_INET)
        self.port = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="ps-bulk", daemon=True)

    def start(self) -> int:
        self._thread.start()
        return self.port

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="ps-bulk-conn",
                             daemon=True).start()

    def _handshake(self, conn: socket.socket) -> bool:
        conn.settimeout(self._io_timeout)
        if _recv(conn, len(MAGIC)) != MAGIC:
            return False
        client_nonce = _recv(conn, auth.NONCE_BYTES)
        nonce = auth.make_nonce()
        conn.sendall(nonce + auth.challenge_response(self._secret, client_nonce, _SHARD))
        answer = _recv(conn, auth.RESPONSE_BYTES)
        return auth.check_challenge_response(self._secret, nonce, answer, _CLIENT)

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if not self._handshake(conn):
                log.warning("bulk connection refused: wrong or missing job secret")
                return
            while not self._closed.is_set():
                conn.settimeout(SERVER_IDLE)  # between requests
                header = _recv_json(conn)
                conn.settimeout(self._io_timeout)
                self._one(conn, header)
        except (OSError, ConnectionError, ValueError) as exc:
            log.debug("bulk connection ended: %s", exc)
        finally:
            conn.close()

    def _one(self, conn: socket.socket, header: dict) -> None:
        try:
            if header.get("op") == "put":
                view = self._staging.upload_view(header)
            elif header.get("op") == "get":
                pieces = self._staging.download_pieces(header)
            else:
                raise PSTransferError(f"unknown bulk op {header.get('op')!r}")
        except ElasticError as exc:
            if header.get("op") == "put":  # the bytes are on their way: read them away
                _recv_into(conn, memoryview(bytearray(int(header.get("length", 0)))))
            _send_json(conn, {"error": type(exc).__name__, "message": str(exc)})
            return
        if header["op"] == "put":
            _recv_into(conn, view)
            self._staging.upload_done(header)
            _send_json(conn, {"ok": True})
        else:
            _send_json(conn, {"ok": True})
            for piece in pieces:
                conn.sendall(piece)

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.close()
        except OSError:
            pass


class BulkClient:
    """Authenticated connections to one shard's bulk port, used one request at a time
    each (at most ``lanes`` at once)."""

    def __init__(self, address: str, secret: str, lanes: int, timeout: float):
        host, _, port = address.rpartition(":")
        self.address = address
        self._target = (host.strip("[]"), int(port))
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
            nonce = auth.make_nonce()
            sock.sendall(MAGIC + nonce)
            shard_nonce = _recv(sock, auth.NONCE_BYTES)
            proof = _recv(sock, auth.RESPONSE_BYTES)
            if not auth.check_challenge_response(self._secret, nonce, proof, _SHARD):
                raise RendezvousAuthError(f"ps bulk port {self.address} does not know the job secret")
            sock.sendall(auth.challenge_response(self._secret, shard_nonce, _CLIENT))
        except (OSError, ConnectionError) as exc:
            sock.close()
            raise RendezvousConnectionError(f"ps bulk handshake with {self.address}: {exc}") from None
        except BaseException:
            sock.close()
            raise
        with self._lock:
            self._all.append(sock)
        return sock

    def _call(self, header: dict, send=(), receive=()) -> None:
        """One request: send ``send`` pieces after the header, receive the reply's bytes
        into the ``receive`` views. Raises RendezvousConnectionError (broken or slow
        connection: the caller retries the operation), or the shard's typed error."""
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
                _send_json(sock, header)
                for piece in send:
                    sock.sendall(piece)
                reply = _recv_json(sock)
                if "error" in reply:
                    cls = error_class(reply["error"]) or PSTransferError
                    raise cls(reply.get("message", ""))
                for view in receive:
                    _recv_into(sock, view)
            except (OSError, ConnectionError, ValueError) as exc:
                self._drop(sock)
                sock = None
                raise RendezvousConnectionError(f"ps bulk transfer with {self.address}: {exc}") from None
            except BaseException:
                self._drop(sock)  # the stream may be mid-message: never reuse it
                sock = None
                raise
            self._idle.put((sock, time.monotonic()))
            sock = None
        finally:
            self._slots.release()

    def put(self, header: dict, pieces) -> None:
        self._call({**header, "op": "put"}, send=pieces)

    def get(self, header: dict, views) -> None:
        self._call({**header, "op": "get"}, receive=views)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            if sock in self._all:
                self._all.remove(sock)
        try:
            sock.close()
        except OSError:
            pass

    def close(self) -> None:
        with self._lock:
            socks, self._all = self._all, []
        for s in socks:
            try:
                s.close()
            except OSError:
                pass
