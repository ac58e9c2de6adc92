"""``FailureMonitor``: the thread that notices a lost ring neighbour, whatever the main
thread is doing.

Each member of a ring has a *control* connection to each neighbour besides the *data*
connections its collectives use. The monitor owns the control connections; on the data
connections it only watches for hang-ups. What it sees it reports through callbacks; the
communicator decides what that means for the round.

* A killed process's sockets are closed by its kernel. The monitor polls every
  connection for hang-up (POLLRDHUP, which does not consume payload bytes) and reads
  the control channel, so it sees the death within milliseconds whether or not a
  collective is running (``lost(rank, why)``).
* A stopped (SIGSTOP) or unreachable peer keeps its sockets open; heartbeats on the
  control channel stop. After ``suspect_after`` without one the neighbour is reported
  *silent* (``silent(rank, seconds)``, once per silence): a host cut off the network
  looks exactly like this, and only someone who can ask the host itself (the driver)
  can tell it from a stopped process, so silence alone proves nothing here. After
  ``peer_timeout`` without a heartbeat the neighbour is reported lost. Heartbeats come from this thread, which needs the GIL only briefly, so
  a busy but alive peer keeps sending them (a C extension holding the GIL for longer
  than ``peer_timeout`` would be mistaken for a stopped peer; numpy and socket calls
  release it).
* A hang-up on a data connection alone is reported only after ``close_grace``: a peer
  that closes on purpose sends CLOSING on the control channel first, and that notice may
  still be on its way. The same grace applies to a neighbour a collective found gone
  (``suspect``).
* CLOSING notices (``closing(origin, reason, settled)``) and ABORT notices
  (``aborted(notice)``) are handed over as they arrive; a neighbour that closed on
  purpose is neither sent heartbeats nor reported lost afterwards.

Whoever breaks the communicator tells both neighbours why on the control channel
(ABORT or CLOSING) and then shuts every socket down; neighbours do the same, so the news
goes round the ring in both directions in well under a millisecond per hop. Sending
those notices is the communicator's job (it owns the sockets); this thread only reads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from elastic.comm import wire
from elastic.comm.base import CommSettings
from elastic.errors import LossCause
from elastic.netio import POLL_DEAD, POLLRDHUP, wake_pipe

log = logging.getLogger(__name__)


@dataclass
class _ControlLink:
    """A neighbour's control connection as the monitor tracks it."""

    sock: socket.socket
    rank: int
    last_heard: float  # monotonic time of the last bytes from it
    parser: wire.CtrlParser = field(default_factory=wire.CtrlParser)


@dataclass(frozen=True)
class AbortNotice:
    """An ABORT notice from neighbour ``neighbour``: ``kind`` is ``wire.ABORT_LOST`` or
    ``wire.ABORT_MISMATCH``; ``lost_rank`` the lost member when known."""

    neighbour: int
    kind: int
    lost_rank: int | None
    message: str
    payload: bytes

    def relay(self) -> bytes:
        """The notice as it is passed on to the other neighbour, unchanged."""
        return wire.encode_ctrl(wire.CTRL_ABORT, self.payload)


LostCallback = Callable[["int | None", str, LossCause], None]
SilentCallback = Callable[[int, float], None]
ClosingCallback = Callable[[int, str, bool], bool]
AbortCallback = Callable[[AbortNotice], None]


@dataclass(frozen=True)
class MonitorHooks:
    """What a ``FailureMonitor`` tells its communicator (each as ``FailureMonitor``
    describes it): ``lost``, ``closing``, ``aborted`` and, optionally, ``silent``."""

    lost: LostCallback
    closing: ClosingCallback
    aborted: AbortCallback
    silent: SilentCallback | None = None


class FailureMonitor:
    """Watches the connections to both ring neighbours from a thread of its own.

    ``control`` and ``data`` are ``(socket, neighbour rank)`` pairs (non-blocking; the
    caller owns and closes them). Callbacks run on the monitor thread, and the thread
    exits after any callback that ended the communicator (``hooks``, a ``MonitorHooks``):

    * ``lost(rank, why, cause)``: a neighbour is gone, ``cause`` says how it was seen
      (``rank`` None: the monitor itself failed);
    * ``closing(origin, reason, settled)``: a neighbour closed on purpose (``origin`` is
      the member that closed first); ``settled`` is True when a collective here already
      found that neighbour gone, so the close must take effect now. Returns True when
      the communicator is finished;
    * ``aborted(notice)``: a neighbour relayed a failure;
    * ``silent(rank, seconds)`` (optional): a neighbour has sent nothing for
      ``suspect_after`` seconds; called once until it is heard from again. It must
      return quickly (it runs between heartbeats).

    The communicator calls ``stop`` when it breaks, for any reason.
    """

    def __init__(
        self,
        name: str,
        control: list[tuple[socket.socket, int]],
        data: list[tuple[socket.socket, int]],
        settings: CommSettings,
        hooks: MonitorHooks,
    ):
        now = time.monotonic()
        self._control = {sock.fileno(): _ControlLink(sock, rank, now) for sock, rank in control}
        # Held while control bytes are read and handled: by the thread, or by a collective
        # that asks for the notices already received (read_now).
        self._read_lock = threading.RLock()
        self._data_socks = data
        self._interval = settings.effective_heartbeat_interval
        self._timeout = settings.peer_timeout
        self._suspect_after = settings.suspect_after
        self._report_silent = hooks.silent
        self._grace = settings.close_grace
        self._report_lost = hooks.lost
        self._report_closing = hooks.closing
        self._report_abort = hooks.aborted
        # Re-entrant: stop() may run in a signal handler that interrupted a thread inside
        # one of the short locked sections.
        self._lock = threading.RLock()
        self._stopped = False
        self._closed_peers: dict[int, str] = {}  # neighbour -> why it closed on purpose
        self._suspects: set[int] = set()
        self._wake_r, self._wake_w = wake_pipe()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Make the thread exit soon. Never blocks; idempotent; safe from any thread."""
        with self._lock:
            self._stopped = True
            self._wake_locked()

    def join(self, timeout: float) -> None:
        """Wait for the thread (not from the thread itself, where it returns at once)."""
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def closed_reason(self, rank: int) -> str | None:
        """Why neighbour ``rank`` closed on purpose, or None when it has not."""
        return self._closed_peers.get(rank)

    def read_now(self) -> None:
        """Handle the notices already received on the control connections, on the
        calling thread. A collective that saw a peer act oddly (a stray header, a closed
        flag) asks first: the peer's CLOSING or ABORT notice was sent before that, and
        may be waiting here while the monitor thread waits for a CPU."""
        with self._read_lock:
            now = time.monotonic()
            for link in list(self._control.values()):
                if self._read_control(link, now) is None:
                    return  # a notice ended the communicator

    def suspect(self, rank: int) -> None:
        """A collective found ``rank`` gone: report it lost after ``close_grace``, unless
        its CLOSING notice arrives (or arrived) first."""
        with self._lock:
            self._suspects.add(rank)
            self._wake_locked()

    def _wake_locked(self) -> None:
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    # --- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._watch()
        except Exception as e:  # a bug here must not leave collectives blocked forever
            log.exception("ring monitor failed")
            self._report_lost(None, f"failure monitor crashed: {e!r}", LossCause.UNKNOWN)
        finally:
            with self._lock:
                r, w = self._wake_r, self._wake_w
                self._wake_r = self._wake_w = -1
            for fd in (r, w):
                if fd >= 0:
                    os.close(fd)

    def _watch(self) -> None:
        heartbeat = wire.encode_ctrl(wire.CTRL_HEARTBEAT)
        grace, timeout = self._grace, self._timeout
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        now = time.monotonic()
        control = self._control
        for fd in control:
            poller.register(fd, select.POLLIN | POLLRDHUP)
        data: dict[int, int] = {}
        for sock, rank in self._data_socks:
            data[sock.fileno()] = rank
            # No POLLIN: the collective owns the payload bytes; only hang-ups matter here.
            poller.register(sock.fileno(), POLLRDHUP)
        hung_up: dict[int, float] = {}  # rank -> when its connection was first seen broken
        closed = self._closed_peers
        silent: set[int] = set()  # neighbours reported silent and not heard from since
        next_beat = now
        while not self._stopped:
            now = time.monotonic()
            if now >= next_beat:
                for link in control.values():
                    if link.rank not in closed:
                        try:
                            link.sock.send(heartbeat)
                        except BlockingIOError:
                            pass
                        except OSError:
                            hung_up.setdefault(link.rank, now)
                next_beat = now + self._interval
            due = [next_beat] + [t + grace for t in hung_up.values()]
            due += [
                link.last_heard + timeout for link in control.values() if link.rank not in closed
            ]
            if self._report_silent is not None:
                due += [
                    link.last_heard + self._suspect_after
                    for link in control.values()
                    if link.rank not in closed and link.rank not in silent
                ]
            events = poller.poll(max(0.0, min(due) - now) * 1000.0 + 1.0)
            now = time.monotonic()
            for fd, ev in events:
                if fd == self._wake_r:
                    self._drain_wake_pipe()
                elif fd in control:
                    link = control[fd]
                    with self._read_lock:
                        eof = self._read_control(link, now)
                        if eof is None:
                            return  # a notice ended the communicator
                        if eof or ev & POLL_DEAD:
                            del control[fd]
                    if eof or ev & POLL_DEAD:
                        poller.unregister(fd)
                        if link.rank not in closed and not self._stopped:
                            self._report_lost(link.rank, "connection closed", LossCause.CLOSED)
                            return
                elif fd in data:
                    poller.unregister(fd)
                    rank = data.pop(fd)
                    if rank not in closed:
                        hung_up.setdefault(rank, now)
            if self._stopped:
                return
            with self._lock:
                suspects, self._suspects = self._suspects, set()
            for rank in suspects:
                if rank in closed:
                    # A collective found this peer gone after it closed on purpose.
                    self._report_closing(rank, closed[rank], True)
                    return
                hung_up.setdefault(rank, now)
            for rank, since in hung_up.items():
                if rank not in closed and now - since >= grace:
                    self._report_lost(rank, "connection broken", LossCause.CLOSED)
                    return
            for link in control.values():
                quiet = now - link.last_heard
                if link.rank in silent and quiet < self._suspect_after:
                    silent.discard(link.rank)  # heard from again: a new silence reports anew
                elif (
                    self._report_silent is not None
                    and link.rank not in closed
                    and link.rank not in silent
                    and quiet >= self._suspect_after
                ):
                    silent.add(link.rank)
                    try:
                        self._report_silent(link.rank, quiet)
                    except Exception:  # a failing hook must not stop failure detection
                        log.exception("on_peer_silent hook failed")
                if link.rank not in closed and now - link.last_heard > timeout:
                    self._report_lost(
                        link.rank,
                        f"no heartbeat for {now - link.last_heard:.1f} s (stopped or unreachable)",
                        LossCause.SILENT,
                    )
                    return

    def _drain_wake_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except OSError:
            pass

    def _read_control(self, link: _ControlLink, now: float) -> bool | None:
        """Read what ``link`` has; True at end of stream, None when a notice ended the
        communicator, False otherwise."""
        while True:
            try:
                chunk = link.sock.recv(65536)
            except BlockingIOError:
                return False
            except OSError:
                return True
            if not chunk:
                return True
            link.last_heard = now
            for kind, payload in link.parser.feed(chunk):
                if self._on_notice(link.rank, kind, payload):
                    return None

    def _on_notice(self, rank: int, kind: int, payload: bytes) -> bool:
        """Handle one control message from neighbour ``rank``; True when it ended the
        communicator."""
        if kind == wire.CTRL_HEARTBEAT:
            return False
        if kind == wire.CTRL_CLOSING:
            origin, reason = wire.decode_closing(payload)
            # Reported before it is recorded: a collective that then finds the peer gone
            # sees the communicator's pending close already in place.
            finished = self._report_closing(origin, reason, False)
            self._closed_peers[rank] = reason
            return finished
        if kind == wire.CTRL_ABORT:
            what, lost, msg = wire.decode_abort(payload)
            self._report_abort(AbortNotice(rank, what, lost, msg, payload))
            return True
        return False  # unknown message types are ignored (forward compatibility)
