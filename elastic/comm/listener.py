"""The data-plane listener a worker opens once at init, and the dialer that connects to one.

A worker creates a ``RingListener`` before it knows any membership, publishes its
``address`` in the store, and reuses it for every round. Peers of a round may connect
before this worker has built its communicator for that round, so authenticated
connections are parked by ``(round_id, src_rank, channel)`` until the communicator
claims them. Connections of rounds older than the newest one begun here are refused
(``VERDICT_STALE``); a connection that does not prove the job secret is dropped without
a verdict.
"""
from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
import weakref
from typing import Callable, Optional

from elastic.errors import CommunicatorClosedError
from rendezvous.auth import NONCE_BYTES, make_nonce
from rendezvous.errors import RendezvousAuthError

from . import wire

log = logging.getLogger(__name__)


def format_address(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(address: str) -> tuple[str, int]:
    """Inverse of ``format_address``. Raises ValueError on a malformed address."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad address {address!r}; expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Exactly ``n`` bytes from a blocking socket before ``deadline`` (monotonic).

    Raises TimeoutError at the deadline and ConnectionError when the peer closes."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("handshake timed out")
        sock.settimeout(remaining)
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("connection closed during handshake")
        got += k
    return bytes(buf)


def _nonblocking_pipe() -> tuple[int, int]:
    """A self-pipe to wake a poll() (os.pipe2 is Linux-only)."""
    r, w = os.pipe()
    for fd in (r, w):
        os.set_blocking(fd, False)
    return r, w


def tune_socket(sock: socket.socket) -> None:
    """Latency and throughput settings shared by every ring connection."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Buffer sizes are left to the kernel's autotuning (tcp_rmem/tcp_wmem): setting
    # SO_RCVBUF/SO_SNDBUF by hand caps them at rmem_max/wmem_max and turns autotuning off.


class RingListener:
    """Accepts ring connections for every round of this worker.

    ``bind_host``: interface to bind (default loopback). ``advertise_host``: host peers
    should dial when it differs (e.g. binding 0.0.0.0). ``secret``: the job secret every
    peer must prove. Raises OSError when the port cannot be bound.
    """

    def __init__(self, bind_host: str = "127.0.0.1", secret: str = "", port: int = 0, *,
                 advertise_host: Optional[str] = None, handshake_timeout: float = 10.0,
                 max_handshakes: int = 64, max_parked: int = 4096):
        if not secret:
            raise ValueError("RingListener needs the job secret")
        self._secret = secret
        self._handshake_timeout = handshake_timeout
        self._max_handshakes = max_handshakes
        self._max_parked = max_parked
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.bind((bind_host, port))
            self._sock.listen(128)
        except BaseException:
            self._sock.close()
            raise
        bound_port = self._sock.getsockname()[1]
        host = advertise_host or bind_host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        self.address = format_address(host, bound_port)

        self._cond = threading.Condition()
        self._parked: dict[tuple[int, int, int], tuple[socket.socket, wire.Hello]] = {}
        self._min_round = -1
        self._closed = False
        self._handshakes = 0
        self._refused = 0          # connections dropped for a bad proof or bad bytes
        self._stale = 0            # connections refused for an old round
        self._notes: dict[tuple[int, int, int], str] = {}
        self._comms: "weakref.WeakSet" = weakref.WeakSet()
        self._wake_r, self._wake_w = _nonblocking_pipe()
        self._thread = threading.Thread(target=self._accept_loop, name="ring-listener",
                                        daemon=True)
        self._thread.start()

    # --- public -------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def advance(self, round_id: int) -> None:
        """Begin ``round_id`` here: refuse connections of older rounds from now on, drop
        parked ones, make communicators of older rounds still being built raise
        CommunicatorClosedError, and close the older live ones."""
        with self._cond:
            if round_id <= self._min_round:
                return
            self._min_round = round_id
            for key in [k for k in self._parked if k[0] < round_id]:
                self._parked.pop(key)[0].close()
            older = [c for c in self._comms if c.round_id < round_id]
            self._cond.notify_all()
        for c in older:
            c.close(f"superseded by round {round_id}")

    def pending(self) -> list[tuple[int, int, int]]:
        """The parked connections as ``(round_id, src_rank, channel)`` (for tests and
        diagnostics)."""
        with self._cond:
            return sorted(self._parked)

    @property
    def refused_count(self) -> int:
        """How many connections were dropped for failing the secret or the format."""
        return self._refused

    @property
    def stale_count(self) -> int:
        """How many authenticated connections were refused for an old round."""
        return self._stale

    def wait_for(self, predicate: Callable[["RingListener"], bool], timeout: float) -> bool:
        """Wait until ``predicate(self)`` holds (re-checked when the listener's state
        changes) or ``timeout`` passes; returns whether it holds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self) -> None:
        """Stop accepting, drop parked connections, and make pending claims raise
        CommunicatorClosedError. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            parked, self._parked = self._parked, {}
            self._cond.notify_all()
        for sock, _ in parked.values():
            sock.close()
        os.write(self._wake_w, b"x")
        self._thread.join(5.0)
        # The accept thread polls these fds, so they are closed only after it has exited.
        if not self._thread.is_alive():
            self._sock.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- used by RingCommunicator ----------------------------------------------------

    def _accepts_secret(self, secret: str) -> bool:
        return secret == self._secret

    def _register(self, comm) -> None:
        """Begin the communicator's round (closing older ones) and track it."""
        self.advance(comm.round_id)
        with self._cond:
            if self._closed:
                raise CommunicatorClosedError("the ring listener is closed")
            if comm.round_id < self._min_round:
                raise CommunicatorClosedError(
                    f"round {comm.round_id} is superseded by round {self._min_round}")
            self._comms.add(comm)

    def _unregister(self, comm) -> None:
        with self._cond:
            self._comms.discard(comm)

    def _stop_reason(self, round_id: int) -> Optional[str]:
        if self._closed:
            return "the ring listener is closed"
        if round_id < self._min_round:
            return f"round {round_id} is superseded by round {self._min_round}"
        return None

    def _claim(self, round_id: int, src_rank: int, channel: int, dst_rank: int, world: int,
               deadline: float, stop: Callable[[], Optional[str]]) -> socket.socket:
        """The parked connection from ``src_rank`` for this round and channel.

        Raises CommunicatorClosedError (listener closed, round superseded, or ``stop()``
        returned a reason) and TimeoutError at ``deadline``."""
        key = (round_id, src_rank, channel)
        with self._cond:
            while True:
                why = self._stop_reason(round_id) or stop()
                if why:
                    raise CommunicatorClosedError(why)
                entry = self._parked.pop(key, None)
                if entry is not None:
                    sock, hello = entry
                    if hello.dst_rank == dst_rank and hello.world == world:
                        return sock
                    # The peer works from another membership of the same round: keep
                    # waiting for a consistent one, but say so if we time out.
                    self._notes[key] = (f"rank {src_rank} connected believing this is rank "
                                        f"{hello.dst_rank} of {hello.world}")
                    sock.close()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    note = self._notes.pop(key, "")
                    raise TimeoutError(note or "no connection")
                # Bounded wait: ``stop()`` is not signalled through the condition.
                self._cond.wait(min(remaining, 0.1))

    # --- internals ------------------------------------------------------------------

    def _accept_loop(self) -> None:
        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._closed:
            for fd, _ev in poller.poll(1000):
                if fd == self._wake_r or self._closed:
                    continue
                try:
                    conn, _peer = self._sock.accept()
                except OSError:
                    continue
                with self._cond:
                    busy = self._handshakes >= self._max_handshakes or self._closed
                    if not busy:
                        self._handshakes += 1
                if busy:
                    conn.close()
                    continue
                threading.Thread(target=self._handshake, args=(conn,),
                                 name="ring-handshake", daemon=True).start()

    def _handshake(self, conn: socket.socket) -> None:
        parked = False
        try:
            deadline = time.monotonic() + self._handshake_timeout
            tune_socket(conn)
            hello_bytes = recv_exact(conn, wire.HELLO_SIZE, deadline)
            hello = wire.decode_hello(hello_bytes)
            nonce = make_nonce()
            conn.sendall(nonce + wire.server_proof(self._secret, hello_bytes))
            proof = recv_exact(conn, wire.PROOF_SIZE, deadline)
            if not wire.check_client_proof(self._secret, hello_bytes, nonce, proof):
                raise PermissionError("bad proof of the job secret")
            with self._cond:
                verdict = (wire.VERDICT_CLOSED if self._closed else
                           wire.VERDICT_STALE if hello.round_id < self._min_round else
                           wire.VERDICT_OK)
                if verdict == wire.VERDICT_STALE:
                    self._stale += 1
            # The verdict goes out before the socket is parked: once parked, a
            # communicator owns the socket and may write on it.
            conn.sendall(bytes([verdict]))
            if verdict != wire.VERDICT_OK:
                return
            key = (hello.round_id, hello.src_rank, hello.channel)
            with self._cond:
                if (self._closed or hello.round_id < self._min_round
                        or len(self._parked) >= self._max_parked):
                    return
                old = self._parked.get(key)
                if old is not None:   # a reconnect replaces the earlier attempt
                    old[0].close()
                conn.settimeout(None)
                self._parked[key] = (conn, hello)
                parked = True
                self._cond.notify_all()
        except (OSError, wire.WireError, PermissionError, TimeoutError) as e:
            with self._cond:
                self._refused += 1
                self._cond.notify_all()
            log.debug("ring handshake refused: %s", e)
        finally:
            with self._cond:
                self._handshakes -= 1
            if not parked:
                conn.close()


def dial(address: str, secret: str, channel: int, round_id: int, src_rank: int,
         dst_rank: int, world: int, deadline: float,
         stop: Callable[[], Optional[str]]) -> socket.socket:
    """Connect to rank ``dst_rank``'s listener and complete the handshake, retrying
    refused connections until ``deadline`` (monotonic).

    Raises CommunicatorClosedError when ``stop()`` gives a reason or the peer already
    runs a newer round, RendezvousAuthError when the listener cannot prove the job
    secret, and TimeoutError at the deadline (naming the last error)."""
    host, port = parse_address(address)
    backoff = 0.01
    last = "no attempt"
    while True:
        why = stop()
        if why:
            raise CommunicatorClosedError(why)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"could not connect to rank {dst_rank} at {address}: {last}")
        try:
            sock = socket.create_connection((host, port), timeout=min(remaining, 5.0))
        except OSError as e:
            last = str(e) or type(e).__name__
            time.sleep(min(backoff, max(0.0, remaining)))
            backoff = min(backoff * 2, 0.25)
            continue
        ok = False
        try:
            tune_socket(sock)
            hello_bytes = wire.encode_hello(wire.Hello(channel, round_id, src_rank, dst_rank,
                                                       world, make_nonce()))
            sock.settimeout(remaining)
            sock.sendall(hello_bytes)
            challenge = recv_exact(sock, wire.CHALLENGE_SIZE, deadline)
            server_nonce, proof = challenge[:NONCE_BYTES], challenge[NONCE_BYTES:]
            if not wire.check_server_proof(secret, hello_bytes, proof):
                raise RendezvousAuthError(
                    f"the listener at {address} (rank {dst_rank}) does not know the job secret")
            sock.sendall(wire.client_proof(secret, hello_bytes, server_nonce))
            verdict = recv_exact(sock, 1, deadline)[0]
            if verdict == wire.VERDICT_OK:
                ok = True
                sock.settimeout(None)
                return sock
            if verdict == wire.VERDICT_STALE:
                raise CommunicatorClosedError(
                    f"rank {dst_rank} already runs a round newer than {round_id}")
            last = "the peer's listener is closing"
        except (OSError, TimeoutError) as e:
            last = str(e) or type(e).__name__
        finally:
            if not ok:
                sock.close()
        time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
        backoff = min(backoff * 2, 0.25)
