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

import contextlib
import logging
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Callable, Protocol

from elastic.comm import wire
from elastic.errors import CommunicatorClosedError
from elastic.netio import client_handshake, make_nonce, recv_exact, server_handshake, wake_pipe
from rendezvous.net import addresses
from rendezvous.net.url import Endpoint
from rendezvous.retry import Backoff

log = logging.getLogger(__name__)

StopCheck = Callable[[], "str | None"]
"""Asked while waiting: a reason to give up now (raised as CommunicatorClosedError), or None."""


class RoundMember(Protocol):
    """What the listener needs of a communicator it tracks."""

    @property
    def round_id(self) -> int: ...

    def close(self, reason: str = "") -> None: ...


def tune_socket(sock: socket.socket) -> None:
    """Latency and throughput settings shared by every ring connection."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Buffer sizes are left to the kernel's autotuning (tcp_rmem/tcp_wmem): setting
    # SO_RCVBUF/SO_SNDBUF by hand caps them at rmem_max/wmem_max and turns autotuning off.


class RingListener:
    """Accepts ring connections for every round of this worker.

    ``bind_host``: interface to bind (default loopback). ``advertise_host``: address peers
    should dial when it differs (binding 0.0.0.0 without one advertises this machine's
    address on its default route, never a host name). ``secret``: the job secret every
    peer must prove.

    Strangers cannot crowd out peers: at most ``max_handshakes`` connections may be
    proving the secret at once, each for at most ``handshake_timeout`` seconds, and when
    all are taken a new connection evicts the oldest one still unproven (an expected
    peer proves itself within a round trip; a connection that sits silent is the one to
    go). A peer evicted by a flood dials again until its connect deadline.

    A communicator of this worker uses it in three steps: ``register`` (begin its round
    here; it is closed when a newer round begins), ``claim`` (take the connections its
    left neighbour made, as they arrive), and ``unregister`` once it is released.

    Raises:
        ValueError: ``secret`` is empty.
        OSError: the port cannot be bound.
    """

    def __init__(
        self,
        bind_host: str = "127.0.0.1",
        secret: str = "",
        port: int = 0,
        *,
        advertise_host: str | None = None,
        handshake_timeout: float = 5.0,
        max_handshakes: int = 64,
        max_parked: int = 4096,
    ):
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
            try:
                host = addresses.default_route_address()
            except addresses.AddressError:
                host = "127.0.0.1"
        self.address = str(Endpoint(host, bound_port))

        self._cond = threading.Condition()
        self._parked: dict[tuple[int, int, int], tuple[socket.socket, wire.Hello]] = {}
        self._min_round = -1
        self._closed = False
        self._unproven: dict[socket.socket, float] = {}  # handshakes under way, by start
        self._evicted = 0  # unproven connections pushed out by newer ones
        self._refused = 0  # connections dropped for a bad proof or bad bytes
        self._stale = 0  # connections refused for an old round
        self._notes: dict[tuple[int, int, int], str] = {}
        self._members: weakref.WeakSet[RoundMember] = weakref.WeakSet()
        self._wake_r, self._wake_w = wake_pipe()
        self._thread = threading.Thread(target=self._accept_loop, name="ring-listener", daemon=True)
        self._thread.start()

    # --- state and life -------------------------------------------------------------

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
            older = [c for c in self._members if c.round_id < round_id]
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
    def evicted_count(self) -> int:
        """How many unproven connections newer ones pushed out (a flood of strangers)."""
        return self._evicted

    @property
    def stale_count(self) -> int:
        """How many authenticated connections were refused for an old round."""
        return self._stale

    def wait_for(self, predicate: Callable[[RingListener], bool], timeout: float) -> bool:
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

    # --- for the communicators of this worker ------------------------------------------

    def register(self, member: RoundMember, secret: str) -> None:
        """Begin ``member.round_id`` here (``advance``: communicators of older rounds are
        closed) and track ``member``, so that a newer round closes it in turn.

        Raises:
            ValueError: ``secret`` is not this listener's job secret.
            CommunicatorClosedError: the listener is closed, or a newer round has begun.
        """
        if secret != self._secret:
            raise ValueError("the membership's secret differs from the listener's")
        self.advance(member.round_id)
        with self._cond:
            why = self.stop_reason(member.round_id)
            if why:
                raise CommunicatorClosedError(why)
            self._members.add(member)

    def unregister(self, member: RoundMember) -> None:
        """Stop tracking ``member`` (it has released its connections). Idempotent."""
        with self._cond:
            self._members.discard(member)

    def stop_reason(self, round_id: int) -> str | None:
        """Why a communicator of ``round_id`` must stop (the listener is closed, or a newer
        round has begun here), or None while it may go on."""
        if self._closed:
            return "the ring listener is closed"
        if round_id < self._min_round:
            return f"round {round_id} is superseded by round {self._min_round}"
        return None

    def claim(
        self,
        round_id: int,
        src_rank: int,
        channel: int,
        dst_rank: int,
        world: int,
        deadline: float,
        stop: StopCheck,
    ) -> socket.socket:
        """Take the authenticated connection rank ``src_rank`` made to this worker (rank
        ``dst_rank`` of ``world``) for ``round_id`` on ``channel``, waiting for it until
        ``deadline`` (monotonic). The caller owns the socket (blocking, no timeout).

        Raises:
            CommunicatorClosedError: the listener closed, the round was superseded, or
                ``stop()`` gave a reason.
            TimeoutError: nothing came by the deadline (the message says when the peer
                connected with another idea of the membership).
        """
        key = (round_id, src_rank, channel)
        with self._cond:
            while True:
                why = self.stop_reason(round_id) or stop()
                if why:
                    raise CommunicatorClosedError(why)
                entry = self._parked.pop(key, None)
                if entry is not None:
                    sock, hello = entry
                    if hello.dst_rank == dst_rank and hello.world == world:
                        return sock
                    # The peer works from another membership of the same round: keep
                    # waiting for a consistent one, but say so if we time out.
                    self._notes[key] = (
                        f"rank {src_rank} connected believing this is rank "
                        f"{hello.dst_rank} of {hello.world}"
                    )
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
                    if self._closed:
                        conn.close()
                        continue
                    if len(self._unproven) >= self._max_handshakes:
                        self._evict_oldest_locked()
                    self._unproven[conn] = time.monotonic()
                threading.Thread(
                    target=self._handshake, args=(conn,), name="ring-handshake", daemon=True
                ).start()

    def _evict_oldest_locked(self) -> None:
        """Push out the unproven connection that has waited longest: its handshake thread
        wakes from ``recv`` with an error and frees the slot."""
        oldest = min(self._unproven, key=self._unproven.__getitem__)
        del self._unproven[oldest]
        self._evicted += 1
        with contextlib.suppress(OSError):
            oldest.shutdown(socket.SHUT_RDWR)

    def _handshake(self, conn: socket.socket) -> None:
        parked = False
        try:
            deadline = time.monotonic() + self._handshake_timeout
            tune_socket(conn)
            hello = server_handshake(
                conn,
                self._secret,
                wire.HANDSHAKE,
                wire.HELLO_SIZE,
                wire.decode_hello,
                deadline=deadline,
            )
            with self._cond:
                if self._unproven.pop(conn, None) is None:
                    raise ConnectionError("evicted by a newer connection")
                verdict = (
                    wire.VERDICT_CLOSED
                    if self._closed
                    else wire.VERDICT_STALE
                    if hello.round_id < self._min_round
                    else wire.VERDICT_OK
                )
                if verdict == wire.VERDICT_STALE:
                    self._stale += 1
            # The verdict goes out before the socket is parked: once parked, a
            # communicator owns the socket and may write on it.
            conn.sendall(bytes([verdict]))
            if verdict != wire.VERDICT_OK:
                return
            key = (hello.round_id, hello.src_rank, hello.channel)
            with self._cond:
                if (
                    self._closed
                    or hello.round_id < self._min_round
                    or len(self._parked) >= self._max_parked
                ):
                    return
                old = self._parked.get(key)
                if old is not None:  # a reconnect replaces the earlier attempt
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
                self._unproven.pop(conn, None)
            if not parked:
                conn.close()


class InFlightDials:
    """The sockets that one communicator's dials still wait on (a connect, a handshake,
    a verdict), so that the communicator, once it breaks, wakes them at once.

    A peer whose host vanished (cut off: no FIN, no RST) answers nothing: without this a
    dial under way would wait for it until the setup's deadline (the connect timeout,
    30 s by default), however soon a newer round made the dial pointless; the waits of
    ``claim`` and of the neighbour links already end with the round.
    """

    def __init__(self) -> None:
        # Re-entrant: abort() may run in a signal handler (a communicator's close) that
        # interrupted this thread inside one of the short locked sections.
        self._lock = threading.RLock()
        self._socks: set[socket.socket] = set()
        self._reason: str | None = None
        self.aborted = threading.Event()  # (a dial's pause between attempts ends too)

    @property
    def reason(self) -> str | None:
        """Why the dials were aborted, or None while they may go on."""
        return self._reason

    def abort(self, reason: str) -> None:
        """Shut down every socket a dial waits on (its connect or read fails at once), and
        refuse new ones. The first reason stays; never blocks."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
            self.aborted.set()
            for sock in self._socks:  # (under the lock: none is closed meanwhile)
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    @contextlib.contextmanager
    def holding(self, sock: socket.socket) -> Iterator[socket.socket]:
        """``sock`` woken by ``abort`` while the block runs.

        Raises:
            CommunicatorClosedError: already aborted (``sock`` is not used).
        """
        with self._lock:
            if self._reason is not None:
                raise CommunicatorClosedError(self._reason)
            self._socks.add(sock)
        try:
            yield sock
        finally:
            with self._lock:
                self._socks.discard(sock)


def dial(
    address: str,
    secret: str,
    channel: int,
    round_id: int,
    src_rank: int,
    dst_rank: int,
    world: int,
    deadline: float,
    stop: StopCheck,
    dials: InFlightDials | None = None,
) -> socket.socket:
    """Connect to rank ``dst_rank``'s listener at ``address`` and complete the handshake,
    retrying refused connections (pauses from 0.01 s doubling to 0.25 s) until
    ``deadline`` (monotonic). ``dials.abort()`` ends it at once, whatever it waits on.
    The caller owns the socket (blocking, no timeout).

    Raises:
        RendezvousConfigError: ``address`` is not ``HOST:PORT``.
        CommunicatorClosedError: ``stop()`` gave a reason, ``dials`` were aborted, or the
            peer already runs a newer round.
        RendezvousAuthError: the listener cannot prove the job secret.
        TimeoutError: at the deadline (the message names the last error).
    """
    target = Endpoint.parse(address, f"rank {dst_rank}'s ring address").sockaddr
    family = socket.AF_INET6 if ":" in target[0] else socket.AF_INET
    in_flight = dials if dials is not None else InFlightDials()
    backoff = Backoff(deadline, initial=0.01, cap=0.25, stop=in_flight.aborted)
    last = "no attempt"
    while True:
        why = stop() or in_flight.reason
        if why:
            raise CommunicatorClosedError(why)
        remaining = backoff.remaining()
        if remaining <= 0:
            raise TimeoutError(f"could not connect to rank {dst_rank} at {address}: {last}")
        ok = False
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            with in_flight.holding(sock):
                sock.settimeout(min(remaining, 5.0))
                sock.connect(target)
                tune_socket(sock)
                hello = wire.encode_hello(
                    wire.Hello(channel, round_id, src_rank, dst_rank, world, make_nonce())
                )
                client_handshake(
                    sock,
                    secret,
                    hello,
                    wire.HANDSHAKE,
                    deadline=deadline,
                    peer=f"the listener at {address} (rank {dst_rank})",
                )
                verdict = recv_exact(sock, 1, deadline)[0]
            if verdict == wire.VERDICT_OK:
                ok = True
                sock.settimeout(None)
                return sock
            if verdict == wire.VERDICT_STALE:
                raise CommunicatorClosedError(
                    f"rank {dst_rank} already runs a round newer than {round_id}"
                )
            last = "the peer's listener is closing"
        except (OSError, TimeoutError) as e:
            last = str(e) or type(e).__name__
        finally:
            if not ok:
                sock.close()
        backoff.pause(clip=True)
