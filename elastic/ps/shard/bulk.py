"""The shard's bulk port: payload parts of staged uploads and downloads over plain TCP
(protocol and reasons: ``elastic.ps.bulk``)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

from elastic.ps.bulk import (
    CLIENT_ROLE,
    MAGIC,
    SERVER_IDLE,
    SHARD_ROLE,
    recv,
    recv_into,
    recv_json,
    send_json,
)
from elastic.ps.errors import PSTransferError
from elastic.ps.protocol import GET, PUT, Part
from elastic.ps.shard.staging import Staging
from rendezvous import auth
from rendezvous.errors import ElasticError

log = logging.getLogger("elastic.ps.shard.bulk")


class BulkServer:
    """The shard's bulk listener on ``host`` (any free port); parts go to and come from
    ``staging``.

    Raises:
        OSError: the port cannot be bound."""

    def __init__(self, secret: str, host: str, staging: Staging, io_timeout: float = 60.0):
        self._secret = secret
        self._staging = staging
        self._io_timeout = io_timeout
        self._sock = socket.create_server(
            (host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
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
            threading.Thread(
                target=self._serve, args=(conn,), name="ps-bulk-conn", daemon=True
            ).start()

    def _handshake(self, conn: socket.socket) -> bool:
        conn.settimeout(self._io_timeout)
        if recv(conn, len(MAGIC)) != MAGIC:
            return False
        client_nonce = recv(conn, auth.NONCE_BYTES)
        nonce = auth.make_nonce()
        conn.sendall(nonce + auth.challenge_response(self._secret, client_nonce, SHARD_ROLE))
        answer = recv(conn, auth.RESPONSE_BYTES)
        return auth.check_challenge_response(self._secret, nonce, answer, CLIENT_ROLE)

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if not self._handshake(conn):
                log.warning("bulk connection refused: wrong or missing job secret")
                return
            while not self._closed.is_set():
                conn.settimeout(SERVER_IDLE)  # between requests
                header = recv_json(conn)
                conn.settimeout(self._io_timeout)
                self._one(conn, header)
        except (OSError, ConnectionError, ValueError) as exc:
            log.debug("bulk connection ended: %s", exc)
        finally:
            conn.close()

    def _one(self, conn: socket.socket, header: dict) -> None:
        op = header.get("op")
        try:
            part = Part.from_dict(header)
            if op == PUT:
                view = self._staging.upload_view(part)
            elif op == GET:
                pieces = self._staging.download_pieces(part)
            else:
                raise PSTransferError(f"unknown bulk op {op!r}")
        except ElasticError as exc:
            if op == PUT:  # the bytes are on their way: read them away
                recv_into(conn, memoryview(bytearray(int(header.get("length", 0)))))
            send_json(conn, {"error": type(exc).__name__, "message": str(exc)})
            return
        if op == PUT:
            recv_into(conn, view)
            self._staging.upload_done(part)
            send_json(conn, {"ok": True})
        else:
            send_json(conn, {"ok": True})
            for piece in pieces:
                conn.sendall(piece)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.close()
