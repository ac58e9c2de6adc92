"""``RoundGroup``: one round's ``torch.distributed`` process group, over the round's
members in the round's rank order, ended with the round.

It is built over a ``RoundStore`` under the round's own prefix of the job's store, and
lives beside the round's ring communicator, whose failure detection it borrows: a
thread waits for the ring to close (a member lost, seen by the ring's heartbeats and
sockets in milliseconds; a newer round; the worker shutting down) and aborts the group.
So no survivor waits in a collective for a peer that is gone: its wait ends at the
abort and raises ``WorkerLostError``, and ``@elastic.run`` recovers as for the ring.

Collectives start here (``start_allreduce`` ...) and return a ``PendingCollective``
whose ``wait()`` raises. The tensors given must belong to this group's round (fresh, or
buffers made for it): an abandoned gloo collective may still write into its buffers
until its sockets close (``backends``), and must not reach a later round's data.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import torch
import torch.distributed as dist

from elastic.errors import SHUT_DOWN, CommunicatorClosedError, WorkerLostError
from elastic.hangs.clock import CLOCK
from elastic.torch.plane.backends import GroupBackend, GroupSettings
from elastic.torch.plane.store import RoundStore
from rendezvous.store import KVStore

log = logging.getLogger(__name__)

#: how long a collective that failed by itself waits for the ring to say why
RING_GRACE = 1.0
#: how long collectives pending when a member shut down may still end (see ``_end_with_ring``)
SHUTDOWN_GRACE = 2.0
_OPS: dict[str, Any] = {"sum": dist.ReduceOp.SUM, "average": dist.ReduceOp.SUM}
_OPS.update(max=dist.ReduceOp.MAX, min=dist.ReduceOp.MIN)


class RoundRing(Protocol):
    """What a group needs of its round's ring communicator (``elastic.comm``): this
    worker's place, and the round's end (its ``error``, when it has one, says why)."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def wait_closed(self, timeout: float | None = None) -> bool: ...


class PendingCollective:
    """A collective in flight on a ``RoundGroup``; ``wait()`` finishes it."""

    def __init__(self, group: RoundGroup, work: dist.Work | None, finish=None):
        self._group = group
        self._work = work
        self._finish = finish  # run once the collective is done (e.g. the average's division)

    def wait(self) -> None:
        """Block until the collective finished.

        Raises WorkerLostError when the round ended first (the group was aborted) or the
        collective failed."""
        if self._work is not None:
            self._group.wait_work(self._work)
            self._work = None
            if self._finish is not None:
                self._finish()


class RoundGroup:
    """The group of round ``round_id`` (this worker's ``rank`` of ``size``), beside
    ``ring``; built on construction (every member builds it, at the same point of the
    program: the round's first collective on this plane).

    Raises WorkerLostError when the group cannot form (a member was lost meanwhile, the
    round ended, or the rendezvous timed out)."""

    def __init__(
        self,
        backend: GroupBackend,
        kv: KVStore,
        prefix: str,
        ring: RoundRing,
        round_id: int,
        settings: GroupSettings,
    ):
        self.backend, self.settings = backend, settings
        self.ring, self.round_id, self.rank, self.size = ring, round_id, ring.rank, ring.size
        self._aborted = threading.Event()
        self._why = ""
        self._lock = threading.Lock()
        threading.Thread(
            target=self._end_with_ring, name=f"elastic-group-r{round_id}", daemon=True
        ).start()
        store = RoundStore(kv, prefix, self._aborted.is_set, settings.connect_timeout)
        started = time.monotonic()
        try:
            self.group = backend.create(store, self.rank, self.size, settings)
        except Exception as exc:  # torch's RuntimeError, our store's stop, a store error
            self.abort(f"group of round {round_id} did not form: {exc}")
            raise self.error() from exc
        self.build_seconds = time.monotonic() - started
        log.info(
            "round %d: %s group of %d formed in %.3f s",
            round_id,
            backend.name,
            self.size,
            self.build_seconds,
        )
        if self._aborted.is_set():  # the round ended as the group formed: abort() saw none
            self.backend.abort(self.group)
            raise self.error()

    # ---- the round's end ----
    def _end_with_ring(self) -> None:
        self.ring.wait_closed()
        if self.ring_error().endswith(f": {SHUT_DOWN}"):
            # A member that left the job finished its part of every collective, but what
            # it sent may still be on its way here over the backend's own sockets (the
            # ring's word of its close can come first): the works pending here may end.
            self._aborted.wait(SHUTDOWN_GRACE)
        self.abort(f"round {self.round_id} is over: {self.ring_error()}")

    def ring_error(self) -> str:
        error = getattr(self.ring, "error", None)
        return str(error) if error is not None else "its communicator closed"

    def abort(self, why: str) -> None:
        """End the group now (any thread, idempotent): collectives waiting here raise
        ``WorkerLostError`` at once, and so does every later one."""
        with self._lock:
            first = not self._aborted.is_set()
            if first:
                self._why = why
        if not first:
            return
        self._aborted.set()
        group = getattr(self, "group", None)
        if group is not None:
            try:
                self.backend.abort(group)
            except Exception:  # an abort that fails leaves the waits ended anyway
                log.exception("aborting the %s group of round %d", self.backend.name, self.round_id)
        log.info("round %d: %s group aborted (%s)", self.round_id, self.backend.name, why)

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    def error(self, ring_grace: float = 0.0) -> WorkerLostError:
        """The error of a collective the round's end cut short: the ring's (a lost
        member, with who and how, for ``@elastic.run``'s report), once the ring has
        closed (within ``ring_grace`` seconds: a collective of the group may fail
        before the ring sees the loss)."""
        self.ring.wait_closed(ring_grace)
        error = getattr(self.ring, "error", None)
        if isinstance(error, WorkerLostError):
            return error
        if self.ring.closed:
            return CommunicatorClosedError(self._why or "the round's group was aborted")
        return WorkerLostError(f"round {self.round_id}: {self._why}")

    # ---- collectives ----
    def _start(self, launch: Any, finish=None) -> PendingCollective:
        if self._aborted.is_set():
            raise self.error()
        try:
            work = launch(self.group)
        except Exception as exc:  # torch refuses: the group is broken
            self.abort(f"collective could not start: {exc}")
            raise self.error(RING_GRACE) from exc
        return PendingCollective(self, work, finish)

    def wait_work(self, work: dist.Work) -> None:
        """Raises WorkerLostError when the group is aborted before ``work`` ends, or
        ``work`` fails."""
        CLOCK.enter()  # a wait on a collective is no hang (elastic.hangs.clock)
        try:
            done = self.backend.wait(work, self._aborted, self.settings.op_timeout)
        except Exception as exc:
            self.abort(f"a collective failed: {exc}")
            raise self.error(RING_GRACE) from exc
        finally:
            CLOCK.leave()
        if not done:  # (a finished one stands though the round ended since: backends)
            self.abort(f"a collective did not finish within {self.settings.op_timeout:g} s")
            raise self.error()

    def start_allreduce(self, tensor: torch.Tensor, op: str) -> PendingCollective:
        """Reduce ``tensor`` in place with ``op`` ("sum", "average", "max", "min"; an
        integer average is floor-divided, as on the ring)."""
        options = dist.AllreduceOptions()
        options.reduceOp = _OPS[op]
        finish = None
        if op == "average":
            size = self.size

            def finish():
                with torch.no_grad():
                    if tensor.is_floating_point() or tensor.is_complex():
                        tensor.div_(size)
                    else:
                        tensor.copy_(torch.div(tensor, size, rounding_mode="floor"))

        return self._start(lambda g: g.allreduce([tensor], options), finish)

    def start_broadcast(self, tensor: torch.Tensor, root: int) -> PendingCollective:
        """``root``'s ``tensor`` written into every member's ``tensor``."""
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = root, 0
        return self._start(lambda g: g.broadcast([tensor], options))

    def start_allgather(self, out: torch.Tensor, tensor: torch.Tensor) -> PendingCollective:
        """Every member's ``tensor`` (same shape everywhere) into ``out`` (``size`` times
        its elements), in rank order."""
        return self._start(lambda g: g._allgather_base(out, tensor))
