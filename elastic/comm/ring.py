"""``RingCommunicator``: collectives over TCP (a ring) or same-host shared memory.

Connections. Rank r dials rank r+1 and accepts from rank r-1, twice: a *data*
connection (collective payloads; r sends on the one it dialled, receives on the one it
accepted) and a *control* connection (heartbeats and close/abort notices, owned by the
monitor thread). When every member is on this host the payloads go through shared
memory instead (``shm.py``); the connections then only carry failure signals.

Failure detection (no collective ever waits out a dead peer):

* A killed process's sockets are closed by its kernel. The monitor thread of each
  neighbour polls every connection for hang-up (POLLRDHUP, which does not consume
  payload bytes) and reads the control channel, so it sees the death within
  milliseconds whether or not a collective is running.
* A stopped (SIGSTOP) or unreachable peer keeps its sockets open; heartbeats on the
  control channel stop, and after ``peer_timeout`` without one the neighbour declares
  it lost. Heartbeats come from a thread that needs the GIL only briefly, so a busy
  but alive peer keeps sending them (a C extension holding the GIL for longer than
  ``peer_timeout`` would be mistaken for a stopped peer; numpy and socket calls release
  it).
* Whoever breaks the communicator (lost peer, mismatch, ``close()``) first tells both
  neighbours why on the control channel (ABORT or CLOSING), then shuts every socket
  down and wakes shared-memory waiters. Neighbours do the same, so the news goes round
  the ring in both directions in well under a millisecond per hop; every survivor's
  pending and next collective raise.
* A peer that closes on purpose (CLOSING) is not reported as lost: a collective still
  running here finishes if it has everything it needs from that peer, otherwise it
  raises CommunicatorClosedError; ``on_peer_failure`` is only called for lost peers.
"""
from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from collections import deque
from functools import partial
from typing import Any, Optional

import numpy as np

from elastic.errors import CommunicatorClosedError
from rendezvous.errors import RendezvousAuthError

from . import layout, shm, wire
from .base import (CollectiveMismatchError, CommSettings, Communicator, FailureCallback,
                   Membership, PeerLostError, ShmUnavailableError, array_to_object,
                   pickle_to_array)
from .listener import RingListener, _nonblocking_pipe, dial
from .outbuf import OutputCache

log = logging.getLogger(__name__)

# Linux reports a peer's FIN without consuming data; elsewhere POLLHUP/POLLERR and the
# heartbeats remain.
_POLLRDHUP = getattr(select, "POLLRDHUP", 0)
_POLL_DEAD = select.POLLERR | select.POLLHUP | select.POLLNVAL


class _IOFailure(Exception):
    """Internal: a data connection failed (the peer is classified by the caller)."""

    def __init__(self, rank: int, detail: str):
        super().__init__(rank, detail)
        self.rank = rank
        self.detail = detail


class _Broken(Exception):
    """Internal: the communicator broke while this thread was waiting."""


class _Mismatch(Exception):
    """Internal: ranks disagree on the collective."""


class RingCommunicator(Communicator):
    """Collectives among ``membership``'s members, over ``listener`` (this worker's).

    Building one connects to the ring neighbours (and sets up shared memory when all
    members are on this host) before ``settings.connect_timeout``. It begins the
    membership's round on the listener, which closes this worker's communicators of
    older rounds. ``on_peer_failure(error)`` is called once, from an internal thread,
    when this communicator breaks because a member was lost (not on orderly closes).

    Raises ValueError (membership secret differs from the listener's),
    PeerLostError (a neighbour did not connect in time, or died during setup),
    CommunicatorClosedError (closed, listener closed, or round superseded meanwhile),
    RendezvousAuthError (a peer's listener cannot prove the job secret),
    ShmUnavailableError (``transport="shm"`` impossible).
    """

    def __init__(self, membership: Membership, listener: RingListener,
                 settings: Optional[CommSettings] = None, *,
                 on_peer_failure: Optional[FailureCallback] = None):
        if not isinstance(membership, Membership):
            raise TypeError("membership must be a Membership")
        if not listener._accepts_secret(membership.secret):
            raise ValueError("the membership's secret differs from the listener's")
        self._m = membership
        self._listener = listener
        self._s = settings or CommSettings()
        self._rank = membership.rank
        self._size = membership.size
        self._left = (self._rank - 1) % self._size
        self._right = (self._rank + 1) % self._size
        self._on_peer_failure = on_peer_failure

        # Re-entrant: close() may run in a signal handler that interrupted this thread
        # inside one of the short locked sections.
        self._lock = threading.RLock()
        self._broken_evt = threading.Event()
        self._error: Optional[tuple[type, str, dict]] = None
        self._in_op = True            # construction counts as an operation
        self._released = False
        self._closed_peers: dict[int, str] = {}   # neighbour -> why it closed on purpose
        self._soft: Optional[tuple[int, str]] = None
        self._suspects: set[int] = set()
        self._socks: list[socket.socket] = []
        self._ctrl_socks: list[socket.socket] = []
        self._data_left: Optional[socket.socket] = None
        self._data_right: Optional[socket.socket] = None
        self._ctrl_left: Optional[socket.socket] = None
        self._ctrl_right: Optional[socket.socket] = None
        self._shm: Optional[shm.ShmGroup] = None
        self._wake_r = self._wake_w = -1
        self._monitor: Optional[threading.Thread] = None
        self._poller = None
        self._seq = 0
        self._transport = "local" if self._size == 1 else "tcp"
        self._outputs = OutputCache()

        listener._register(self)
        try:
            if self._size > 1:
                self._setup()
        except BaseException as e:
            err = self._setup_error(e)
            if isinstance(err, (PeerLostError, CommunicatorClosedError, RendezvousAuthError,
                                ShmUnavailableError, CollectiveMismatchError)):
                cls, msg = type(err), str(err)
            else:
                cls, msg = CommunicatorClosedError, f"setup failed: {err!r}"
            self._break(cls, msg, kw=_error_kw(err),
                        relay=wire.encode_closing(self._rank, f"setup failed: {err}"),
                        shm_code=shm.CLOSED_ABORT)
            self._exit_op()
            self._join_monitor()
            if err is e:
                raise
            raise err from e
        self._exit_op()

    # --- properties ------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def round_id(self) -> int:
        return self._m.round_id

    @property
    def transport(self) -> str:
        return self._transport

    @property
    def closed(self) -> bool:
        return self._error is not None

    @property
    def error(self) -> Optional[BaseException]:
        """The exception every collective raises now, or None while healthy."""
        return self._new_error() if self._error is not None else None

    def __repr__(self):
        state = "ok" if self._error is None else "broken"
        return (f"RingCommunicator(round={self.round_id}, rank={self._rank}, "
                f"size={self._size}, transport={self._transport}, {state})")

    # --- setup -----------------------------------------------------------------------

    def _stop_reason(self) -> Optional[str]:
        if self._error is not None:
            return self._error[1]
        return self._listener._stop_reason(self.round_id)

    def _add_sock(self, sock: socket.socket, ctrl: bool) -> socket.socket:
        with self._lock:
            self._socks.append(sock)
            if ctrl:
                self._ctrl_socks.append(sock)
            broken = self._error is not None
        if broken:
            raise _Broken()
        return sock

    def _setup(self) -> None:
        m, s = self._m, self._s
        deadline = time.monotonic() + s.connect_timeout
        n, r = self._size, self._rank
        try:
            for channel in (wire.CHANNEL_DATA, wire.CHANNEL_CTRL):
                sock = dial(m.addresses[self._right], m.secret, channel, m.round_id, r,
                            self._right, n, deadline, self._stop_reason)
                self._add_sock(sock, channel == wire.CHANNEL_CTRL)
                if channel == wire.CHANNEL_DATA:
                    self._data_right = sock
                else:
                    self._ctrl_right = sock
        except TimeoutError as e:
            raise PeerLostError(f"rank {self._right} did not answer within "
                                f"{s.connect_timeout:g} s ({e})", rank=self._right,
                                direct=True) from None
        try:
            for channel in (wire.CHANNEL_DATA, wire.CHANNEL_CTRL):
                sock = self._listener._claim(m.round_id, self._left, channel, r, n, deadline,
                                             self._stop_reason)
                self._add_sock(sock, channel == wire.CHANNEL_CTRL)
                if channel == wire.CHANNEL_DATA:
                    self._data_left = sock
                else:
                    self._ctrl_left = sock
        except TimeoutError as e:
            raise PeerLostError(f"rank {self._left} did not connect within "
                                f"{s.connect_timeout:g} s ({e})", rank=self._left,
                                direct=True) from None
        for sock in self._socks:
            sock.setblocking(False)
        if s.socket_buffer_bytes:
            for sock in (self._data_left, self._data_right):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, s.socket_buffer_bytes)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, s.socket_buffer_bytes)
        self._poller = select.poll()
        self._wake_r, self._wake_w = _nonblocking_pipe()
        self._monitor = threading.Thread(target=self._monitor_loop, daemon=True,
                                         name=f"ring-monitor-r{m.round_id}-{r}")
        self._monitor.start()
        self._setup_shm(deadline)

    def _setup_shm(self, deadline: float) -> None:
        """Agree with every member on shared memory: all offer a segment and run under
        the same kernel boot, then all map every segment and confirm."""
        s, n, r = self._s, self._size, self._rank
        seg = None
        if s.transport != "tcp" and shm.shm_supported():
            try:
                seg = shm.ShmSegment(s.shm_piece_bytes)
            except OSError as e:
                log.info("no shared-memory segment (%s); using TCP", e)
        try:
            infos = self._tcp_blobs(seg.info() if seg else b"", self._setup_header(), deadline)
            usable = shm.same_host(infos)
            group = None
            if usable:
                spin = s.shm_spin_us if s.shm_spin_us is not None else shm.default_spin_us(n)
                try:
                    group = shm.ShmGroup(r, n, seg, infos, spin)
                except OSError as e:
                    log.info("cannot map the peers' shared memory (%s); using TCP", e)
                oks = self._tcp_blobs(b"\x01" if group else b"\x00", self._setup_header(),
                                      deadline)
                usable = all(b == b"\x01" for b in oks)
                if not usable and group is not None:
                    group.close()
                    seg = None   # group.close() unmapped it
            if usable:
                with self._lock:
                    self._shm = group
                self._transport = "shm"
            elif s.transport == "shm":
                raise ShmUnavailableError(
                    "transport='shm' but the members cannot share memory "
                    f"(same host: {shm.same_host(infos)}, supported: {shm.shm_supported()})")
        finally:
            if seg is not None:
                seg.close_fd()       # every peer has mapped it (or will not)
                if self._shm is None:
                    seg.mm.close()

    def _setup_header(self) -> wire.OpHeader:
        self._seq += 1
        return wire.OpHeader(wire.KIND_SETUP, self._seq)

    def _setup_error(self, e: BaseException) -> BaseException:
        """The typed error a failed construction raises."""
        if isinstance(e, (PeerLostError, CommunicatorClosedError, RendezvousAuthError,
                          ShmUnavailableError)):
            return e
        if isinstance(e, (_Broken, _IOFailure)) or self._error is not None:
            if self._error is not None:
                return self._new_error()
            return PeerLostError(f"rank {e.rank} failed during setup: {e.detail}",
                                 rank=e.rank, direct=True)
        if isinstance(e, TimeoutError):
            return PeerLostError(f"setup did not finish within "
                                 f"{self._s.connect_timeout:g} s: {e}")
        if isinstance(e, _Mismatch):
            return CollectiveMismatchError(str(e))
        return e

    # --- breaking and releasing -----------------------------------------------------

    def _new_error(self) -> BaseException:
        cls, msg, kw = self._error
        return cls(msg, **kw)

    def _break(self, cls: type, msg: str, *, kw: Optional[dict] = None,
               relay: Optional[bytes] = None, callback: bool = False,
               shm_code: int = shm.CLOSED_ABORT) -> bool:
        """Make ``cls(msg, **kw)`` the error of every call from now on (first caller
        wins), tell the neighbours (``relay``), and wake everything blocked here."""
        with self._lock:
            if self._error is not None:
                return False
            self._error = (cls, msg, kw or {})
            self._broken_evt.set()
            if relay:
                for sock in self._ctrl_socks:
                    try:
                        sock.send(relay, socket.MSG_DONTWAIT)
                    except OSError:
                        pass
            for sock in self._socks:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            if self._shm is not None:
                self._shm.mark_closed(shm_code)
                self._shm.wake_all()
            self._wake_monitor_locked()
            if not self._in_op:
                self._release_locked()
        if callback and self._on_peer_failure is not None:
            try:
                self._on_peer_failure(cls(msg, **(kw or {})))
            except Exception:   # the hook must not break failure handling
                log.exception("on_peer_failure hook failed")
        return True

    def _wake_monitor_locked(self) -> None:
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass

    def _release_locked(self) -> None:
        if self._released:
            return
        self._released = True
        for sock in self._socks:
            if sock in self._ctrl_socks:
                # Read what is left so close() sends FIN, not RST (an RST could
                # destroy the close/abort notice before the neighbour reads it).
                try:
                    while sock.recv(65536, socket.MSG_DONTWAIT):
                        pass
                except OSError:
                    pass
            sock.close()
        if self._shm is not None:
            self._shm.close()
        self._outputs.clear()
        self._listener._unregister(self)

    def _exit_op(self) -> None:
        soft = None
        with self._lock:
            self._in_op = False
            if self._error is not None:
                self._release_locked()
            else:
                soft = self._soft
        if soft is not None:
            self._break_closed(*soft)

    def _break_closed(self, origin: int, reason: str) -> None:
        msg = f"rank {origin} closed the communicator" + (f": {reason}" if reason else "")
        self._break(CommunicatorClosedError, msg, relay=wire.encode_closing(origin, reason),
                    shm_code=shm.CLOSED_ORDERLY)

    def _join_monitor(self) -> None:
        t = self._monitor
        if t is not None and t is not threading.current_thread():
            t.join(5.0)

    def close(self, reason: str = "") -> None:
        """See ``Communicator.close``. Also stops the monitor thread."""
        msg = "communicator closed" + (f": {reason}" if reason else "")
        self._break(CommunicatorClosedError, msg, relay=wire.encode_closing(self._rank, reason),
                    shm_code=shm.CLOSED_ORDERLY)
        self._join_monitor()

    def _peer_failed(self, rank: int, detail: str, orderly: Optional[bool] = None) -> None:
        """A collective found ``rank`` gone. Wait briefly for the monitor to learn why
        (orderly close vs crash) before reporting it as lost."""
        if self._error is not None:
            return
        why = self._closed_peers.get(rank)
        if orderly or why is not None:
            self._break_closed(*(self._soft or (rank, why or detail)))
            return
        with self._lock:
            self._suspects.add(rank)
            self._wake_monitor_locked()
        if not self._broken_evt.wait(self._s.close_grace + 0.3):
            why = self._closed_peers.get(rank)
            if why is not None:
                self._break_closed(*(self._soft or (rank, why)))
            else:
                self._lost(rank, detail, direct=rank in (self._left, self._right))

    def _lost(self, rank: Optional[int], detail: str, direct: bool = True) -> None:
        msg = (f"rank {rank} lost: {detail} (seen by rank {self._rank}, "
               f"round {self.round_id})")
        self._break(PeerLostError, msg, kw={"rank": rank, "direct": direct},
                    relay=wire.encode_abort(wire.ABORT_LOST, rank, msg), callback=True)

    # --- the monitor thread ----------------------------------------------------------

    def _monitor_loop(self) -> None:
        try:
            self._monitor_body()
        except Exception as e:   # a bug here must not leave collectives blocked forever
            log.exception("ring monitor failed")
            self._lost(None, f"failure monitor crashed: {e!r}", direct=False)
        finally:
            with self._lock:
                r, w = self._wake_r, self._wake_w
                self._wake_r = self._wake_w = -1
            for fd in (r, w):
                if fd >= 0:
                    os.close(fd)

    def _monitor_body(self) -> None:
        s = self._s
        interval = s.effective_heartbeat_interval
        timeout = s.peer_timeout
        grace = s.close_grace
        heartbeat = wire.encode_ctrl(wire.CTRL_HEARTBEAT)
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        now = time.monotonic()
        ctrl: dict[int, list] = {}   # fd -> [sock, rank, parser, last time heard from]
        for sock, rank in ((self._ctrl_left, self._left), (self._ctrl_right, self._right)):
            ctrl[sock.fileno()] = [sock, rank, wire.CtrlParser(), now]
            poller.register(sock.fileno(), select.POLLIN | _POLLRDHUP)
        data: dict[int, int] = {}
        for sock, rank in ((self._data_left, self._left), (self._data_right, self._right)):
            data[sock.fileno()] = rank
            # No POLLIN: the collective owns the payload bytes; only hang-ups matter here.
            poller.register(sock.fileno(), _POLLRDHUP)
        hup: dict[int, float] = {}    # rank -> when its connection was first seen broken
        next_beat = now
        while self._error is None:
            now = time.monotonic()
            if now >= next_beat:
                for ent in ctrl.values():
                    if ent[1] not in self._closed_peers:
                        try:
                            ent[0].send(heartbeat)
                        except BlockingIOError:
                            pass
                        except OSError:
                            hup.setdefault(ent[1], now)
                next_beat = now + interval
            due = [next_beat] + [t + grace for t in hup.values()]
            due += [ent[3] + timeout for ent in ctrl.values() if ent[1] not in self._closed_peers]
            wait_ms = max(0.0, min(due) - now) * 1000.0 + 1.0
            events = poller.poll(wait_ms)
            now = time.monotonic()
            for fd, ev in events:
                if fd == self._wake_r:
                    try:
                        while os.read(fd, 4096):
                            pass
                    except OSError:
                        pass
                elif fd in ctrl:
                    ent = ctrl[fd]
                    eof = False
                    while True:
                        try:
                            chunk = ent[0].recv(65536)
                        except BlockingIOError:
                            break
                        except OSError:
                            eof = True
                            break
                        if not chunk:
                            eof = True
                            break
                        ent[3] = now
                        for kind, payload in ent[2].feed(chunk):
                            if self._on_ctrl(ent[1], kind, payload):
                                return
                    if eof or ev & _POLL_DEAD:
                        poller.unregister(fd)
                        del ctrl[fd]
                        if ent[1] not in self._closed_peers and self._error is None:
                            self._lost(ent[1], "connection closed")
                            return
                elif fd in data:
                    poller.unregister(fd)
                    rank = data.pop(fd)
                    if rank not in self._closed_peers:
                        hup.setdefault(rank, now)
            if self._error is not None:
                return
            with self._lock:
                suspects, self._suspects = self._suspects, set()
            for rank in suspects:
                if rank in self._closed_peers:
                    # A collective found this peer gone after it closed on purpose.
                    self._break_closed(*(self._soft or (rank, self._closed_peers[rank])))
                    return
                hup.setdefault(rank, now)
            for rank, since in hup.items():
                if rank not in self._closed_peers and now - since >= grace:
                    self._lost(rank, "connection broken")
                    return
            for ent in ctrl.values():
                if ent[1] not in self._closed_peers and now - ent[3] > timeout:
                    self._lost(ent[1], f"no heartbeat for {now - ent[3]:.1f} s "
                                       f"(stopped or unreachable)")
                    return

    def _on_ctrl(self, rank: int, kind: int, payload: bytes) -> bool:
        """Handle one control message from neighbour ``rank``; True when it broke us."""
        if kind == wire.CTRL_HEARTBEAT:
            return False
        if kind == wire.CTRL_CLOSING:
            origin, reason = wire.decode_closing(payload)
            with self._lock:
                self._closed_peers[rank] = reason
                idle = not self._in_op
                if not idle and self._soft is None:
                    # Let the running collective finish if it already has what it
                    # needs from that peer; it raises if it does not.
                    self._soft = (origin, reason)
            if idle:
                self._break_closed(origin, reason)
                return True
            return False
        if kind == wire.CTRL_ABORT:
            what, lost, msg = wire.decode_abort(payload)
            relay = wire.encode_ctrl(wire.CTRL_ABORT, payload)
            if what == wire.ABORT_MISMATCH:
                self._break(CollectiveMismatchError, msg, relay=relay)
            elif lost == self._rank:
                self._break(PeerLostError, f"this worker was declared lost by rank {rank}: "
                                           f"{msg}", kw={"rank": lost, "direct": False})
            else:
                self._break(PeerLostError, msg, kw={"rank": lost, "direct": False},
                            relay=relay, callback=True)
            return True
        return False   # unknown message types are ignored (forward compatibility)

    # --- running a collective ------------------------------------------------------

    def _check(self) -> None:
        if self._error is not None:
            raise _Broken()

    def _run(self, fn, *args):
        with self._lock:
            if self._error is not None:
                raise self._new_error()
            if self._in_op:
                raise RuntimeError("another collective is running on this communicator "
                                   "(one collective at a time)")
            self._in_op = True
        try:
            self._seq += 1
            return fn(*args)
        except _IOFailure as f:
            self._peer_failed(f.rank, f.detail)
            raise self._error_now(f"connection to rank {f.rank} failed: {f.detail}") from None
        except shm.SharedPeerClosed as e:
            self._peer_failed(e.rank, "stopped taking part in the collective",
                              orderly=e.code == shm.CLOSED_ORDERLY)
            raise self._error_now(f"rank {e.rank} left the collective") from None
        except _Broken:
            raise self._new_error() from None
        except _Mismatch as e:
            msg = f"collective mismatch (seen by rank {self._rank}): {e}"
            self._break(CollectiveMismatchError, msg,
                        relay=wire.encode_abort(wire.ABORT_MISMATCH, None, msg))
            raise self._new_error() from None
        except BaseException as e:
            # Anything else (a bug, MemoryError, KeyboardInterrupt) leaves the streams
            # in an unknown state: break so peers do not wait on us.
            self._break(CommunicatorClosedError,
                        f"collective aborted on rank {self._rank} by {type(e).__name__}",
                        relay=wire.encode_closing(self._rank, f"aborted by {type(e).__name__}"))
            raise
        finally:
            self._exit_op()

    def _error_now(self, fallback: str) -> BaseException:
        if self._error is None:   # pragma: no cover - _peer_failed always breaks
            self._lost(None, fallback, direct=False)
        return self._new_error()

    # --- the TCP engine ------------------------------------------------------------

    def _pump(self, sendq: deque, recvq: deque, deadline: Optional[float] = None) -> None:
        """Send ``sendq`` (memoryviews) to the right neighbour and fill ``recvq``
        (``[memoryview, callback]``, in order) from the left one, on non-blocking
        sockets, until both are empty. Callbacks run when their buffer is full and may
        append to either queue; that is how chunks are pipelined: the kernel keeps
        moving bytes into and out of the socket buffers while a callback reduces."""
        ss, rs = self._data_right, self._data_left
        sfd, rfd = ss.fileno(), rs.fileno()
        poller = self._poller
        right, left = self._right, self._left
        while sendq or recvq:
            progressed = False
            while sendq:
                mv = sendq[0]
                try:
                    k = ss.send(mv)
                except BlockingIOError:
                    break
                except OSError as e:
                    self._check()
                    raise _IOFailure(right, str(e) or type(e).__name__) from None
                progressed = True
                if k < len(mv):
                    sendq[0] = mv[k:]
                    break
                sendq.popleft()
            while recvq:
                item = recvq[0]
                try:
                    k = rs.recv_into(item[0])
                except BlockingIOError:
                    break
                except OSError as e:
                    self._check()
                    raise _IOFailure(left, str(e) or type(e).__name__) from None
                if k == 0:
                    self._check()
                    raise _IOFailure(left, "connection closed")
                progressed = True
                if k < len(item[0]):
                    item[0] = item[0][k:]
                    continue
                recvq.popleft()
                if item[1] is not None:
                    item[1]()
            if progressed:
                continue
            self._check()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("the ring did not answer in time")
            poller.register(sfd, select.POLLOUT if sendq else 0)
            poller.register(rfd, select.POLLIN if recvq else 0)
            for fd, ev in poller.poll(1000):
                if ev & _POLL_DEAD:
                    self._check()
                    if fd == rfd and not recvq:
                        raise _IOFailure(left, "connection closed")
                    if fd == sfd and not sendq:
                        raise _IOFailure(right, "connection closed")

    def _header_check(self, mine: wire.OpHeader, buf: bytearray) -> None:
        try:
            theirs = wire.OpHeader.decode(bytes(buf))
        except wire.WireError as e:
            raise _Mismatch(f"rank {self._left} sent bytes out of step ({e})") from None
        why = wire.header_mismatch(mine, theirs)
        if why:
            raise _Mismatch(f"with rank {self._left}: {why}")

    def _tcp_blobs(self, mine: bytes, hdr: wire.OpHeader,
                   deadline: Optional[float] = None) -> list[bytes]:
        """Ring allgather of small byte strings (n-1 hops); also a barrier."""
        n, r = self._size, self._rank
        blobs: list[Optional[bytes]] = [None] * n
        blobs[r] = mine
        lenlen = wire.META_LEN_SIZE
        sendq = deque([memoryview(hdr.encode() + len(mine).to_bytes(lenlen, "big") + mine)])
        recvq: deque = deque()
        hdrbuf = bytearray(wire.OP_HEADER_SIZE)
        recvq.append([memoryview(hdrbuf), partial(self._header_check, hdr, hdrbuf)])

        def want(step: int) -> None:
            lenbuf = bytearray(lenlen)
            recvq.append([memoryview(lenbuf), partial(got_len, step, lenbuf)])

        def got_len(step: int, lenbuf: bytearray) -> None:
            body = bytearray(int.from_bytes(lenbuf, "big"))
            if body:
                recvq.append([memoryview(body), partial(got_body, step, lenbuf, body)])
            else:
                got_body(step, lenbuf, body)

        def got_body(step: int, lenbuf: bytearray, body: bytearray) -> None:
            blobs[(r - step - 1) % n] = bytes(body)
            if step < n - 2:
                sendq.append(memoryview(bytes(lenbuf) + bytes(body)))
                want(step + 1)

        want(0)
        self._pump(sendq, recvq, deadline)
        return blobs   # type: ignore[return-value]

    def _tcp_allreduce(self, x: np.ndarray, out: np.ndarray, op: str,
                       hdr: wire.OpHeader) -> None:
        n, r = self._size, self._rank
        item = x.dtype.itemsize
        fn = layout.reducer(op)
        # No copy of x into out first: every segment of out is written exactly once,
        # by the reduce-scatter (x's part + what arrives) or by the allgather.
        outb = out.view(np.uint8)
        xb = x.view(np.uint8)
        segs = layout.ring_segments(x.size, n)
        sub = layout.elems_per_chunk(self._s.chunk_bytes, item)
        biggest = max(b - a for a, b in segs)
        tmp = np.empty(min(sub, biggest), dtype=x.dtype)
        tmpb = tmp.view(np.uint8)

        def view(a: int, b: int) -> memoryview:
            return memoryview(outb[a * item:b * item])

        sendq: deque = deque([memoryview(hdr.encode())])
        recvq: deque = deque()
        hdrbuf = bytearray(wire.OP_HEADER_SIZE)
        recvq.append([memoryview(hdrbuf), partial(self._header_check, hdr, hdrbuf)])
        for a, b in layout.chunk_ranges(*segs[r], sub):
            sendq.append(memoryview(xb[a * item:b * item]))

        def reduced(a: int, b: int, last: bool) -> None:
            part = out[a:b]
            fn(x[a:b], tmp[:b - a], out=part)
            if last and op == "average":
                layout.finish_average(part, n)
            # Step s+1 of the reduce-scatter (or step 0 of the allgather) sends this.
            sendq.append(view(a, b))

        # Reduce-scatter: at step s receive segment r-s-1 and fold it in.
        for s in range(n - 1):
            for a, b in layout.chunk_ranges(*segs[(r - s - 1) % n], sub):
                recvq.append([memoryview(tmpb[:(b - a) * item]),
                              partial(reduced, a, b, s == n - 2)])
        # Allgather: at step s receive the finished segment r-s in place and pass it on.
        for s in range(n - 1):
            forward = s < n - 2
            for a, b in layout.chunk_ranges(*segs[(r - s) % n], sub):
                v = view(a, b)
                recvq.append([v, partial(sendq.append, v) if forward else None])
        self._pump(sendq, recvq)

    def _tcp_broadcast(self, x: Optional[np.ndarray], root: int,
                       hdr: wire.OpHeader) -> np.ndarray:
        # Every rank, the root included, sends its own header to the right and checks
        # its left neighbour's, so a rank that runs something else is caught by both of
        # its neighbours. The root's meta and data then flow round the ring.
        forward = self._right != root
        chunk = self._s.chunk_bytes
        sendq: deque = deque([memoryview(hdr.encode())])
        recvq: deque = deque()
        hdrbuf = bytearray(wire.OP_HEADER_SIZE)
        recvq.append([memoryview(hdrbuf), partial(self._header_check, hdr, hdrbuf)])
        if self._rank == root:
            out = x.copy()
            sendq.append(memoryview(wire.encode_array_meta(out.dtype, out.shape)))
            ob = out.reshape(-1).view(np.uint8)
            for a, b in layout.chunk_ranges(0, ob.size, chunk):
                sendq.append(memoryview(ob[a:b]))
            self._pump(sendq, recvq)
            return out
        state: dict[str, Any] = {}
        lenbuf = bytearray(wire.META_LEN_SIZE)

        def got_len() -> None:
            body = bytearray(wire.decode_meta_len(bytes(lenbuf)))
            recvq.append([memoryview(body), partial(got_meta, body)])

        def got_meta(body: bytearray) -> None:
            try:
                dtype, shape = wire.decode_array_meta_body(bytes(body))
            except wire.WireError as e:
                raise _Mismatch(f"bad broadcast meta from rank {self._left}: {e}") from None
            out = np.empty(shape, dtype=dtype)
            state["out"] = out
            if forward:
                sendq.append(memoryview(bytes(lenbuf) + bytes(body)))
            ob = out.reshape(-1).view(np.uint8)
            for a, b in layout.chunk_ranges(0, ob.size, chunk):
                v = memoryview(ob[a:b])
                recvq.append([v, partial(sendq.append, v) if forward else None])

        recvq.append([memoryview(lenbuf), got_len])
        self._pump(sendq, recvq)
        return state["out"]

    def _tcp_allgather(self, x: np.ndarray, hdr: wire.OpHeader):
        n, r = self._size, self._rank
        meta = wire.encode_array_meta(x.dtype, x.shape)[wire.META_LEN_SIZE:]
        bodies = self._tcp_blobs(meta, hdr)
        metas = []
        for j, body in enumerate(bodies):
            try:
                metas.append(wire.decode_array_meta_body(body))
            except wire.WireError as e:
                raise _Mismatch(f"bad allgather meta from rank {j}: {e}") from None
        dtype, shape, offsets = _gather_layout(metas)
        out = np.empty(shape, dtype=dtype)
        ob = out.reshape(-1).view(np.uint8)
        ob[offsets[r]:offsets[r + 1]] = x.reshape(-1).view(np.uint8)
        chunk = self._s.chunk_bytes
        sendq: deque = deque(memoryview(ob[a:b]) for a, b in
                             layout.chunk_ranges(offsets[r], offsets[r + 1], chunk))
        recvq: deque = deque()
        for s in range(n - 1):
            src = (r - s - 1) % n
            forward = s < n - 2
            for a, b in layout.chunk_ranges(offsets[src], offsets[src + 1], chunk):
                v = memoryview(ob[a:b])
                recvq.append([v, partial(sendq.append, v) if forward else None])
        self._pump(sendq, recvq)
        return out, [m[1][0] for m in metas]

    # --- public collectives ----------------------------------------------------------

    def allreduce(self, x, op: str = "sum") -> np.ndarray:
        """See ``Communicator.allreduce``."""
        layout.check_reduce_op(op)
        arr = layout.as_contiguous(x)
        layout.check_reduce_dtype(arr.dtype)
        return self._run(self._allreduce, arr, op)

    def _allreduce(self, arr: np.ndarray, op: str) -> np.ndarray:
        out = self._outputs.empty(arr.shape, arr.dtype)
        if self._size == 1:
            np.copyto(out, arr)
            return out
        hdr = wire.OpHeader(wire.KIND_ALLREDUCE, self._seq, op=wire.OP_CODES[op],
                            dtype_code=arr.dtype.num, nelem=arr.size,
                            shape_crc=layout.shape_crc(arr.shape))
        flat, oflat = arr.reshape(-1), out.reshape(-1)
        if self._shm is not None:
            why = self._shm.allreduce(flat, oflat, op, hdr, self._check)
            if why:
                raise _Mismatch(why)
        else:
            self._tcp_allreduce(flat, oflat, op, hdr)
        return out

    def broadcast(self, x, root: int = 0) -> np.ndarray:
        """See ``Communicator.broadcast``."""
        if not 0 <= root < self._size:
            raise ValueError(f"root {root} out of range for {self._size} ranks")
        arr = None
        if self._rank == root:
            arr = layout.as_contiguous(x)
            layout.check_transfer_dtype(arr.dtype)
        return self._run(self._broadcast, arr, root)

    def _broadcast(self, arr: Optional[np.ndarray], root: int) -> np.ndarray:
        if self._size == 1:
            return arr.copy()
        hdr = wire.OpHeader(wire.KIND_BROADCAST, self._seq, root=root)
        if self._shm is None:
            return self._tcp_broadcast(arr, root, hdr)
        if self._rank == root:
            meta = wire.encode_array_meta(arr.dtype, arr.shape)
            res = self._shm.broadcast(arr.reshape(-1).view(np.uint8), hdr, meta, root,
                                      self._check)
            if isinstance(res, str):
                raise _Mismatch(res)
            return arr.copy()
        res = self._shm.broadcast(None, hdr, b"", root, self._check)
        if isinstance(res, str):
            raise _Mismatch(res)
        return res

    def allgather(self, x) -> np.ndarray:
        """See ``Communicator.allgather``."""
        arr = layout.as_contiguous(x)
        layout.check_transfer_dtype(arr.dtype)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        return self._run(self._allgather, arr)[0]

    def _allgather(self, arr: np.ndarray):
        if self._size == 1:
            return arr.copy(), [arr.shape[0]]
        hdr = wire.OpHeader(wire.KIND_ALLGATHER, self._seq)
        if self._shm is None:
            return self._tcp_allgather(arr, hdr)
        meta = wire.encode_array_meta(arr.dtype, arr.shape)
        res = self._shm.allgather(arr.reshape(-1).view(np.uint8), hdr, meta, self._check)
        if isinstance(res, str):
            raise _Mismatch(res)
        metas, buf, _offsets = res
        dtype, shape, _ = _gather_layout(metas)
        return buf.view(dtype).reshape(shape), [m[1][0] for m in metas]

    def broadcast_object(self, obj: Any = None, root: int = 0) -> Any:
        """See ``Communicator.broadcast_object``."""
        payload = pickle_to_array(obj) if self._rank == root else None
        return array_to_object(self.broadcast(payload, root))

    def allgather_object(self, obj: Any) -> list:
        """See ``Communicator.allgather_object``."""
        out, sizes = self._run(self._allgather, pickle_to_array(obj))
        parts, start = [], 0
        for sz in sizes:
            parts.append(array_to_object(out[start:start + sz]))
            start += sz
        return parts

    def barrier(self) -> None:
        """See ``Communicator.barrier``."""
        self._run(self._barrier)

    def _barrier(self) -> None:
        if self._size == 1:
            return
        hdr = wire.OpHeader(wire.KIND_BARRIER, self._seq)
        if self._shm is not None:
            why = self._shm.barrier_op(hdr, self._check)
            if why:
                raise _Mismatch(why)
        else:
            self._tcp_blobs(b"", hdr)


def _gather_layout(metas: list[tuple[np.dtype, tuple[int, ...]]]):
    """(dtype, output shape, byte offsets of each rank's block) for an allgather.

    Raises _Mismatch when dtypes or trailing dimensions differ."""
    dtype, shape0 = metas[0]
    for j, (dt, sh) in enumerate(metas):
        if dt != dtype:
            raise _Mismatch(f"allgather dtypes differ: rank 0 has {dtype}, rank {j} has {dt}")
        if len(sh) == 0 or tuple(sh[1:]) != tuple(shape0[1:]):
            raise _Mismatch(f"allgather shapes differ beyond axis 0: rank 0 has {shape0}, "
                            f"rank {j} has {sh}")
    rows = [sh[0] for _, sh in metas]
    row_bytes = int(np.prod(shape0[1:], dtype=np.int64)) * dtype.itemsize
    offsets = [0]
    for k in rows:
        offsets.append(offsets[-1] + k * row_bytes)
    return dtype, (sum(rows),) + tuple(shape0[1:]), offsets


def _error_kw(err: BaseException) -> dict:
    if isinstance(err, PeerLostError):
        return {"rank": err.rank, "direct": err.direct}
    return {}
