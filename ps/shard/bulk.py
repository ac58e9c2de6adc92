"""The shard's bulk port: payload parts of staged uploads and downloads over plain TCP
(protocol and reasons: ``ps.bulk``).

Whatever strangers do to the port, it goes on serving the job's clients
(``settings.BulkLimits``):

* A new connection has ``handshake_timeout`` seconds in all to prove the job secret
  (a deadline for the whole handshake, not per read, so trickled bytes do not stretch it).
* At most ``max_handshakes`` connections are proving it at once: one more pushes out the
  oldest that has sent nothing yet (then the oldest other). An honest client sends its
  first bytes right after connecting and proves the secret within a round trip, so a
  silent connection that has waited longest is the likeliest stranger.
* At most ``max_connections`` authenticated connections are served at once, a thread
  each; one more is closed at once (a client then retries its transfer).
* When the process runs out of file descriptors (EMFILE, ENFILE) or socket buffers, the
  accept loop allows ``fd_reserve`` fewer unproven connections for a while, pushing out
  the excess (the rest of the shard needs descriptors too: gRPC, the store,
  checkpoint files), backs off (up to ``backoff_max``) and goes on: it ends only with
  ``close``.

Refusals are logged as one rate-limited line per kind, never a line per connection.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time

from elastic.netio import HandshakeRefused, recv_exact_into, server_handshake
from ps.bulk import HANDSHAKE, MAGIC, OPENING_SIZE, SERVER_IDLE, recv_json, send_json
from ps.errors import PSHeaderError, PSTransferError
from ps.protocol import GET, PUT, Part
from ps.settings import BulkLimits
from ps.shard.staging import Staging
from rendezvous.errors import ElasticError
from rendezvous.rate_log import RateLimitedLog
from rendezvous.retry import Backoff

log = logging.getLogger("ps.shard.bulk")

# accept() failures that mean "out of descriptors or memory for now", not "closed"
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_DISCARD_CHUNK = 1 << 16
# seconds the lowered cap on unproven connections holds after running out of descriptors
_CAP_RECOVERY = 10.0


def _has_begun(conn: socket.socket) -> bool:
    """Whether a just-accepted connection has already sent the handshake's MAGIC (an
    honest client sends it right after connecting), looked at without reading it."""
    try:
        return conn.recv(len(MAGIC), socket.MSG_PEEK | socket.MSG_DONTWAIT) == MAGIC
    except OSError:
        return False


class _Late(Exception):
    """Internal: a connection did not prove the secret within its handshake deadline."""


class BulkServer:
    """The shard's bulk listener on ``host`` (any free port); parts go to and come from
    ``staging``. ``io_timeout`` bounds each read or write of a transfer.

    Raises:
        OSError: the port cannot be bound."""

    def __init__(
        self,
        secret: str,
        host: str,
        staging: Staging,
        io_timeout: float = 60.0,
        limits: BulkLimits | None = None,
    ):
        self._secret = secret
        self._staging = staging
        self._io_timeout = io_timeout
        self._limits = limits or BulkLimits()
        self._sock = socket.create_server(
            (host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
        self.port = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._lock = threading.Lock()
        # connections proving the secret, oldest first (dicts keep insertion order), each
        # with whether it has begun the handshake (sent MAGIC)
        self._handshaking: dict[socket.socket, bool] = {}
        self._handshake_cap = self._limits.max_handshakes
        self._cap_lowered_until = 0.0
        self._serving = 0
        self._refusals = RateLimitedLog(logger=log)
        self._thread = threading.Thread(target=self._accept, name="ps-bulk", daemon=True)

    def start(self) -> int:
        self._thread.start()
        return self.port

    # ---------------------------------------------------------------- accepting
    def _accept(self) -> None:
        backoff = None
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError as exc:
                if self._closed.is_set():
                    return
                closed = self._make_room() if exc.errno in _EXHAUSTED else 0
                self._refusals.warn(
                    f"accept-{exc.errno}",
                    f"ps bulk port {self.port}: cannot accept a connection ({exc.strerror}); "
                    f"closed {closed} unproven connection(s), backing off",
                )
                if backoff is None:
                    backoff = Backoff(
                        None, initial=0.005, cap=self._limits.backoff_max, stop=self._closed
                    )
                backoff.pause()
                continue
            backoff = None
            self._admit(conn)

    def _make_room(self) -> int:
        """The process is out of descriptors: allow ``fd_reserve`` fewer unproven
        connections for a while, closing the excess. Returns how many were closed."""
        with self._lock:
            cap = max(1, len(self._handshaking) - self._limits.fd_reserve)
            self._handshake_cap = min(self._handshake_cap, cap)
            self._cap_lowered_until = time.monotonic() + _CAP_RECOVERY
            excess = len(self._handshaking) - self._handshake_cap
        return self._push_out(excess)

    def _admit(self, conn: socket.socket) -> None:
        began = _has_begun(conn)
        with self._lock:
            if time.monotonic() >= self._cap_lowered_until:
                self._handshake_cap = self._limits.max_handshakes
            self._handshaking[conn] = began
            excess = len(self._handshaking) - self._handshake_cap
        if excess > 0:
            self._push_out(excess)
            self._refusals.warn(
                "crowded",
                f"ps bulk port {self.port}: {self._handshake_cap} connections still proving "
                "the job secret; closed the oldest (silent ones first)",
            )
        try:
            threading.Thread(
                target=self._serve, args=(conn,), name="ps-bulk-conn", daemon=True
            ).start()
        except RuntimeError as exc:  # no thread can be started now
            self._refusals.warn("thread", f"ps bulk port {self.port}: {exc}")
            self._forget(conn)
            conn.close()

    def _push_out(self, count: int) -> int:
        """End ``count`` connections still proving the secret: the oldest that have sent
        nothing first (an honest client speaks at once), then the oldest others. Their
        threads close them. Returns how many were ended."""
        with self._lock:
            silent = [c for c, began in self._handshaking.items() if not began]
            talking = [c for c, began in self._handshaking.items() if began]
            victims = (silent + talking)[: max(count, 0)]
            for conn in victims:
                del self._handshaking[conn]
        for conn in victims:
            # shutdown, not close: its thread is reading it, and closing would free the
            # descriptor number for reuse under that read
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        return len(victims)

    def _began(self, conn: socket.socket) -> None:
        with self._lock:
            if conn in self._handshaking:
                self._handshaking[conn] = True

    def _forget(self, conn: socket.socket) -> None:
        with self._lock:
            self._handshaking.pop(conn, None)

    # ---------------------------------------------------------------- one connection
    def _handshake(self, conn: socket.socket) -> bool:
        """The client proves the job secret and the shard proves it back
        (``ps.bulk``), by the deadline; False for a client that is not a bulk
        client or does not know the secret.

        Raises:
            _Late: the deadline passed.
            OSError, ConnectionError: the connection broke or was pushed out."""

        def bulk_opening(opening: bytes) -> None:
            if not opening.startswith(MAGIC):
                raise HandshakeRefused("not a ps bulk client")
            self._began(conn)

        try:
            server_handshake(
                conn,
                self._secret,
                HANDSHAKE,
                OPENING_SIZE,
                bulk_opening,
                deadline=time.monotonic() + self._limits.handshake_timeout,
            )
        except HandshakeRefused:
            return False
        except TimeoutError:
            raise _Late() from None
        return True

    def _serve(self, conn: socket.socket) -> None:
        served = False
        try:
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                proven = self._handshake(conn)
            except _Late:
                self._refusals.warn(
                    "late",
                    f"ps bulk port {self.port}: closed a connection that did not prove the "
                    f"job secret within {self._limits.handshake_timeout:g}s",
                )
                return
            finally:
                self._forget(conn)
            if not proven:
                self._refusals.warn(
                    "auth", f"ps bulk port {self.port}: refused a connection without the job secret"
                )
                return
            with self._lock:
                served = self._serving < self._limits.max_connections
                self._serving += served
            if not served:
                self._refusals.warn(
                    "full",
                    f"ps bulk port {self.port}: {self._limits.max_connections} connections "
                    "already served; closed a new one",
                )
                return
            while not self._closed.is_set():
                conn.settimeout(SERVER_IDLE)  # between requests
                header = recv_json(conn)
                conn.settimeout(self._io_timeout)
                if not self._one(conn, header):
                    return
        except (OSError, ConnectionError, ValueError, RecursionError) as exc:
            log.debug("bulk connection ended: %s", exc)
        finally:
            if served:
                with self._lock:
                    self._serving -= 1
            conn.close()

    def _one(self, conn: socket.socket, header: dict) -> bool:
        """Serve one request; False when the connection cannot go on (a header that
        does not parse: what follows it on the stream is unknown)."""
        try:
            part = Part.from_dict(header)
        except PSHeaderError as exc:
            self._refusals.warn("malformed", f"ps bulk port {self.port}: {exc}")
            send_json(conn, {"error": type(exc).__name__, "message": str(exc)})
            return False
        try:
            if part.op == PUT:
                view = self._staging.upload_view(part)
            elif part.op == GET:
                pieces = self._staging.download_pieces(part)
            else:
                raise PSTransferError(f"unknown bulk op {part.op!r}")
        except ElasticError as exc:
            if part.op == PUT:  # the bytes are on their way: read them away
                self._discard(conn, part.length)
            send_json(conn, {"error": type(exc).__name__, "message": str(exc)})
            return True
        if part.op == PUT:
            recv_exact_into(conn, view)
            self._staging.upload_done(part)
            send_json(conn, {"ok": True})
        else:
            send_json(conn, {"ok": True})
            for piece in pieces:
                conn.sendall(piece)
        return True

    @staticmethod
    def _discard(conn: socket.socket, n: int) -> None:
        """Read ``n`` bytes away in small pieces (never a buffer of a size a client says)."""
        scratch = memoryview(bytearray(_DISCARD_CHUNK))
        while n > 0:
            k = min(n, _DISCARD_CHUNK)
            recv_exact_into(conn, scratch[:k])
            n -= k

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept loop
        with contextlib.suppress(OSError):
            self._sock.close()
