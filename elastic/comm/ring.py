"""``RingCommunicator``: one round's collectives among its members, over TCP (a ring) or
same-host shared memory, and the rules by which a failure anywhere ends it everywhere.

Setup connects each member to both neighbours and starts the failure monitor
(``elastic.comm.peers``); the members then agree on a transport
(``elastic.comm.transports``). This class keeps setup, the broken state and dispatch.
The guarantees (no collective ever waits out a dead peer):

* A lost neighbour is noticed by the monitor within milliseconds when its process dies,
  and after ``peer_timeout`` without heartbeats when it is stopped or unreachable.
* Whoever breaks the communicator (lost peer, mismatch, ``close()``) first tells both
  neighbours why on the control channel (ABORT or CLOSING), then shuts every socket
  down and aborts the transport (shared-memory waiters wake). Neighbours do the same,
  so the news goes round the ring in both directions in well under a millisecond per
  hop; every survivor's pending and next collective raise.
* A peer that closes on purpose (CLOSING) is not reported as lost: a collective still
  running here finishes if it has everything it needs from that peer, otherwise it
  raises CommunicatorClosedError; ``on_peer_failure`` is only called for lost peers.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from typing import Any, Callable, TypeVar

import numpy as np

from elastic.comm import layout, wire
from elastic.comm.base import CommSettings, Communicator, FailureCallback, Membership
from elastic.comm.outbuf import OutputCache
from elastic.comm.peers.links import Connector, NeighbourLinks
from elastic.comm.peers.listener import RingListener
from elastic.comm.peers.monitor import AbortNotice, FailureMonitor, MonitorHooks
from elastic.comm.setup_errors import TYPED_ERRORS, setup_break
from elastic.comm.transports.base import (
    Interrupted,
    LocalTransport,
    Mismatch,
    PeerGone,
    Transport,
    TransportContext,
)
from elastic.comm.transports.selection import open_transport
from elastic.comm.transports.tcp_ring import TcpRing
from elastic.errors import (
    CollectiveMismatchError,
    CommunicatorClosedError,
    LossCause,
    PeerLostError,
)
from elastic.hangs.clock import CLOCK

log = logging.getLogger(__name__)

T = TypeVar("T")


class RingCommunicator(Communicator):
    """Collectives among ``membership``'s members, over ``listener`` (this worker's).

    Building one connects to the ring neighbours (and sets up shared memory when all
    members are on this host) before ``settings.connect_timeout``. It begins the
    membership's round on the listener, which closes this worker's communicators of
    older rounds. ``on_peer_failure(error)`` is called once when this communicator
    breaks because a member was lost (not on orderly closes), from the monitor thread or
    from the thread whose collective found the loss. ``on_peer_silent(rank, seconds)``
    is called from the monitor thread when a neighbour has been silent for
    ``settings.suspect_after`` seconds (see ``CommSettings``).

    Raises:
        ValueError: the membership's secret differs from the listener's.
        PeerLostError: a neighbour did not connect in time, or died during setup.
        CommunicatorClosedError: closed, listener closed, or round superseded meanwhile.
        RendezvousAuthError: a peer's listener cannot prove the job secret.
        ShmUnavailableError: ``transport="shm"`` (or "hier") is impossible.
    """

    def __init__(
        self,
        membership: Membership,
        listener: RingListener,
        settings: CommSettings | None = None,
        *,
        on_peer_failure: FailureCallback | None = None,
        on_peer_silent: Callable[[int, float], Any] | None = None,
    ):
        if not isinstance(membership, Membership):
            raise TypeError("membership must be a Membership")
        self._membership = membership
        self._listener = listener
        self._settings = settings or CommSettings()
        self._rank = membership.rank
        self._size = membership.size
        self._links = NeighbourLinks(self._rank, self._size)
        self._on_peer_failure = on_peer_failure
        self._on_peer_silent = on_peer_silent

        # Re-entrant: close() may run in a signal handler that interrupted this thread
        # inside one of the short locked sections.
        self._lock = threading.RLock()
        self._broken_evt = threading.Event()
        self._error: tuple[type, str, dict] | None = None
        self._in_op = True  # construction counts as an operation
        self._released = False
        # An orderly close (origin, reason) come during a collective: done when it ends.
        self._pending_close: tuple[int, str] | None = None
        self._news = threading.Event()  # set once a close notice came or we broke
        self._monitor: FailureMonitor | None = None
        self._connector: Connector | None = None  # its dials end when this breaks
        self._transport: Transport = LocalTransport()  # a world of one; else set up below
        self._seq = 0
        self._outputs = OutputCache()

        listener.register(self, membership.secret)
        try:
            if self._size > 1:
                self._setup()
        except BaseException as e:
            err = self._setup_error(e)
            cls, msg, kw = setup_break(err)
            self._break(
                cls, msg, kw=kw, relay=wire.encode_closing(self._rank, f"setup failed: {err}")
            )
            self._exit_op()
            self._join_monitor()
            if err is e:
                raise
            raise err from e
        self._exit_op()

    # --- properties ------------------------------------------------------------------

    @property
    def round_id(self) -> int:
        return self._membership.round_id

    @property
    def transport(self) -> str:
        return self._transport.name

    @property
    def closed(self) -> bool:
        return self._error is not None

    def wait_closed(self, timeout: float | None = None) -> bool:
        return self._broken_evt.wait(timeout)  # set by the break (see Communicator)

    @property
    def error(self) -> BaseException | None:
        """The exception every collective raises now, or None while healthy."""
        return self._new_error() if self._error is not None else None

    def __repr__(self):
        state = "ok" if self._error is None else "broken"
        where = f"round={self.round_id}, rank={self._rank}, size={self._size}"
        return f"RingCommunicator({where}, transport={self.transport}, {state})"

    # --- setup -----------------------------------------------------------------------

    def _stop_reason(self) -> str | None:
        if self._error is not None:
            return self._error[1]
        return self._listener.stop_reason(self.round_id)

    def _setup(self) -> None:
        settings, links = self._settings, self._links
        deadline = time.monotonic() + settings.connect_timeout
        connector = Connector(self._membership, self._listener, deadline, self._stop_reason)
        with self._lock:
            self._connector = connector
            if self._error is not None:  # broke meanwhile: no dial starts
                connector.abort(self._error[1])
        data_left, data_right, ctrl_left, ctrl_right = links.connect(
            connector.dial, connector.claim, settings.connect_timeout, self._check
        )
        monitor = FailureMonitor(
            f"ring-monitor-r{self.round_id}-{self._rank}",
            [(ctrl_left, links.left), (ctrl_right, links.right)],
            [(data_left, links.left), (data_right, links.right)],
            settings,
            MonitorHooks(
                lost=lambda rank, why, cause: self._lost(rank, why, cause, direct=rank is not None),
                closing=self._on_peer_closing,
                aborted=self._on_abort,
                silent=self._on_peer_silent,
            ),
        )
        with self._lock:
            self._monitor = monitor
            if self._error is not None:  # broke meanwhile: the thread exits at once
                monitor.stop()
        monitor.start()
        ring = TcpRing(self._rank, self._size, data_left, data_right, settings, self._check)
        transport = open_transport(
            TransportContext(
                rank=self._rank,
                size=self._size,
                settings=settings,
                ring=ring,
                exchange=lambda blob: ring.exchange(blob, self._setup_header(), deadline),
                dial=connector.dial,
                claim=connector.claim,
                deadline=deadline,
                check=self._check,
            )
        )
        with self._lock:
            self._transport = transport

    def _setup_header(self) -> wire.OpHeader:
        self._seq += 1
        return wire.OpHeader(wire.KIND_SETUP, self._seq)

    def _setup_error(self, e: BaseException) -> BaseException:
        """The typed error a failed construction raises."""
        if isinstance(e, TYPED_ERRORS):
            return e
        if self._error is not None:
            return self._new_error()
        if isinstance(e, PeerGone):
            msg = f"rank {e.rank} failed during setup: {e.detail}"
            return PeerLostError(msg, rank=e.rank, direct=True, cause=LossCause.CLOSED)
        if isinstance(e, TimeoutError):
            msg = f"setup did not finish within {self._settings.connect_timeout:g} s: {e}"
            return PeerLostError(msg, cause=LossCause.SILENT)
        if isinstance(e, Mismatch):
            return CollectiveMismatchError(str(e))
        return e

    # --- breaking and releasing -----------------------------------------------------

    def _new_error(self) -> BaseException:
        assert self._error is not None
        cls, msg, kw = self._error
        return cls(msg, **kw)

    def _break(
        self,
        cls: type,
        msg: str,
        *,
        kw: dict | None = None,
        relay: bytes | None = None,
        callback: bool = False,
        orderly: bool = False,
    ) -> bool:
        """Make ``cls(msg, **kw)`` the error of every call from now on (first caller
        wins), tell the neighbours (``relay``), and wake everything blocked here."""
        with self._lock:
            if self._error is not None:
                return False
            self._error = (cls, msg, kw or {})
            self._broken_evt.set()
            self._news.set()
            if relay:
                self._links.notify(relay)
            self._links.shutdown()
            if self._connector is not None:
                self._connector.abort(msg)
            self._transport.abort(orderly)
            if self._monitor is not None:
                self._monitor.stop()
            if not self._in_op:
                self._release_locked()
        if callback and self._on_peer_failure is not None:
            try:
                self._on_peer_failure(cls(msg, **(kw or {})))
            except Exception:  # the hook must not break failure handling
                log.exception("on_peer_failure hook failed")
        return True

    def _release_locked(self) -> None:
        if self._released:
            return
        self._released = True
        self._links.close()
        self._transport.close()
        self._outputs.clear()
        self._listener.unregister(self)

    def _exit_op(self) -> None:
        pending = None
        with self._lock:
            self._in_op = False
            if self._error is not None:
                self._release_locked()
            else:
                pending = self._pending_close
        if pending is not None:
            self._break_closed(*pending)

    def _break_closed(self, origin: int, reason: str, msg: str | None = None) -> None:
        if msg is None:
            msg = f"rank {origin} closed the communicator" + (f": {reason}" if reason else "")
        relay = wire.encode_closing(origin, reason)
        self._break(CommunicatorClosedError, msg, relay=relay, orderly=True)

    def _join_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor.join(5.0)

    def close(self, reason: str = "") -> None:
        """See ``Communicator.close``. Also stops the monitor thread."""
        because = f": {reason}" if reason else ""
        self._break_closed(self._rank, reason, f"communicator closed{because}")
        self._join_monitor()

    def _peer_failed(self, rank: int, detail: str, orderly: bool | None = None) -> None:
        """A collective found ``rank`` gone. Wait briefly for the monitor to learn why
        (orderly close vs crash) before reporting it as lost."""
        monitor = self._monitor
        assert monitor is not None  # transports that raise PeerGone run after setup
        monitor.read_now()
        if self._error is not None:
            return
        why = monitor.closed_reason(rank)
        if orderly or why is not None:
            if self._pending_close is None:
                # Shared memory shows it closed on purpose; its CLOSING notice, sent
                # before, says who closed first and why (it may still be on its way).
                self._news.wait(self._settings.close_grace)
            self._break_closed(*(self._pending_close or (rank, why or detail)))
            return
        monitor.suspect(rank)
        if not self._broken_evt.wait(self._settings.close_grace + 0.3):
            why = monitor.closed_reason(rank)
            if why is not None:
                self._break_closed(*(self._pending_close or (rank, why)))
            else:
                neighbour = rank in (self._links.left, self._links.right)
                self._lost(rank, detail, LossCause.CLOSED, direct=neighbour)

    def _lost(self, rank: int | None, detail: str, cause: LossCause, direct: bool = True) -> None:
        msg = f"rank {rank} lost: {detail} (seen by rank {self._rank}, round {self.round_id})"
        kw = {"rank": rank, "direct": direct, "cause": cause}
        relay = wire.encode_abort(wire.ABORT_LOST, rank, msg)
        self._break(PeerLostError, msg, kw=kw, relay=relay, callback=True)

    # --- what the failure monitor reports ----------------------------------------------

    def _on_peer_closing(self, origin: int, reason: str, settled: bool) -> bool:
        with self._lock:
            if not settled and self._in_op:
                # Let the running collective finish if it already has what it needs
                # from that peer; it raises if it does not.
                if self._pending_close is None:
                    self._pending_close = (origin, reason)
                    self._news.set()
                return False
            pending = self._pending_close
        self._break_closed(*(pending or (origin, reason)))
        return True

    def _on_abort(self, notice: AbortNotice) -> None:
        if notice.kind == wire.ABORT_MISMATCH:
            self._break(CollectiveMismatchError, notice.message, relay=notice.relay())
            return
        kw = {"rank": notice.lost_rank, "direct": False, "cause": LossCause.RELAYED}
        if notice.lost_rank == self._rank:  # the others went on without this worker
            msg = f"this worker was declared lost by rank {notice.neighbour}: {notice.message}"
            self._break(PeerLostError, msg, kw=kw)
        else:
            self._break(PeerLostError, notice.message, kw=kw, relay=notice.relay(), callback=True)

    # --- running a collective ------------------------------------------------------

    def _check(self) -> None:
        if self._error is not None:
            raise Interrupted()

    def _run(self, call: Callable[[wire.OpHeader], T], kind: int, **fields: int) -> T:
        """``call(header)`` as this communicator's next collective (``kind`` and
        ``fields`` make the header every rank checks), with failures turned into the
        public errors."""
        with self._lock:
            if self._error is not None:
                raise self._new_error()
            if self._in_op:
                raise RuntimeError(
                    "another collective is running on this communicator (one collective at a time)"
                )
            self._in_op = True
        CLOCK.enter()  # (the hang watchdog's clock: elastic.hangs.clock)
        try:
            self._seq += 1
            return call(wire.OpHeader(kind, self._seq, **fields))
        except PeerGone as e:
            self._peer_failed(e.rank, e.detail, orderly=e.orderly)
            if self._error is None:  # pragma: no cover - _peer_failed always breaks
                left = f"rank {e.rank} left the collective: {e.detail}"
                self._lost(None, left, LossCause.CLOSED, direct=False)
            raise self._new_error() from None
        except Interrupted:
            raise self._new_error() from None
        except Mismatch as e:
            # A peer that closed on purpose may have begun a collective alone just before
            # (its header comes first); its CLOSING notice, sent before, then decides.
            if self._monitor is not None:
                self._monitor.read_now()
            if self._pending_close is not None:
                self._break_closed(*self._pending_close)
            msg = f"collective mismatch (seen by rank {self._rank}): {e}"
            relay = wire.encode_abort(wire.ABORT_MISMATCH, None, msg)
            self._break(CollectiveMismatchError, msg, relay=relay)
            raise self._new_error() from None
        except BaseException as e:
            # Anything else (a bug, MemoryError, KeyboardInterrupt) leaves the streams
            # in an unknown state: break so peers do not wait on us.
            self._break(
                CommunicatorClosedError,
                f"collective aborted on rank {self._rank} by {type(e).__name__}",
                relay=wire.encode_closing(self._rank, f"aborted by {type(e).__name__}"),
            )
            raise
        finally:
            CLOCK.leave()
            self._exit_op()

    # --- the collectives (arguments already checked by Communicator) ---------------

    def _allreduce(self, arr: np.ndarray, op: str) -> np.ndarray:
        return self._run(
            partial(self._allreduce_into_new, arr, op),
            wire.KIND_ALLREDUCE,
            op=wire.OP_CODES[op],
            dtype_code=arr.dtype.num,
            nelem=arr.size,
            shape_crc=layout.shape_crc(arr.shape),
        )

    def _allreduce_into_new(self, arr: np.ndarray, op: str, hdr: wire.OpHeader) -> np.ndarray:
        out = self._outputs.empty(arr.shape, arr.dtype)
        self._transport.allreduce(arr.reshape(-1), out.reshape(-1), op, hdr)
        return out

    def _broadcast(self, arr: np.ndarray | None, root: int) -> np.ndarray:
        call = partial(self._transport.broadcast, arr, root)
        return self._run(call, wire.KIND_BROADCAST, root=root)

    def _allgather_rows(self, arr: np.ndarray) -> tuple[np.ndarray, list[int]]:
        return self._run(partial(self._transport.allgather, arr), wire.KIND_ALLGATHER)

    def barrier(self) -> None:
        """See ``Communicator.barrier``."""
        self._run(self._transport.barrier, wire.KIND_BARRIER)
