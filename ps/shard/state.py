"""One shard's variables, optimizer slots and global step, and the rules that change
them (no networking: ``server.py`` decodes requests and calls in here).

Everything is guarded by one condition variable. Mutations (create, apply) pass the
*gate*: during a checkpoint the coordinator pauses the gate so a snapshot sees one
step; a paused gate lets applies through only while ``step < target`` (the checkpoint's
step), and reopens by itself after its lease in case the coordinator died.

async: a push is applied on arrival; ``(client, seq)`` de-duplicates a push the client
repeated after a lost answer.

sync: a push carries ``(round, size, rank, step, generation)``. Step ``s`` is applied,
with the rank-ordered average of the round's gradients, once every rank of the round
has pushed ``s``. A push of a newer round drops the older round's incomplete step.
``generation`` names the shards' common history: a rollback to a checkpoint starts a
new one, so a gradient computed before the rollback is refused (``rolled_back``)
instead of being applied to restored parameters.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from ps.errors import (
    PSNotReadyError,
    PSProtocolError,
    PSRoundChangedError,
    PSShapeError,
    PSUninitializedError,
)
from ps.memory import unshared
from ps.optimizers import make_optimizer
from ps.partition import Slice
from ps.protocol import (
    APPLIED,
    PENDING,
    ROLLED_BACK,
    SUPERSEDED,
    UNKNOWN,
    Description,
    Pulled,
    ShardStatus,
    StepReply,
    VariableInfo,
)
from ps.shard.journal import JournalOps
from ps.shard.state_checkpoints import CheckpointOps, _Pause, _Var

log = logging.getLogger("ps.shard.state")


def initial_generation(checkpoint_id: int | None) -> str:
    """The generation every shard agrees on after loading ``checkpoint_id`` at start."""
    return f"c{checkpoint_id or 0}"


class ShardState(CheckpointOps, JournalOps):
    """State of shard ``index`` of ``num_shards`` in ``mode`` ("async" or "sync"); its
    checkpoint operations are in ``CheckpointOps``, what a backup needs of each change
    in ``JournalOps``."""

    def __init__(self, index: int, num_shards: int, mode: str, clock=time.monotonic):
        self.index, self.num_shards, self.mode = index, num_shards, mode
        self._clock = clock
        self._cond = threading.Condition()
        self._vars: dict[str, _Var] = {}
        self.step = 0
        self.generation = initial_generation(None)
        self.loaded = False  # nothing restored yet: data calls are refused
        self._closed = False  # the shard stops: nothing more is applied, nobody waits
        self.base: int | None = None  # checkpoint this state equals while ``clean``
        self._version = 0  # bumped by every mutation
        self._clean_version = 0
        self._dedup: dict[str, int] = {}
        self._pause: _Pause | None = None
        self._round = -1
        self._async_round = -1  # the newest round an async push came from
        self._round_size: int | None = None
        self._pending: dict[int, list[tuple[str, np.ndarray]]] = {}

    # ---------------------------------------------------------------- helpers
    def _bump(self) -> None:
        self._version += 1

    def _require_loaded(self) -> None:
        if not self.loaded:
            raise PSNotReadyError(f"ps shard {self.index} is restoring its state")

    def _may_apply(self) -> bool:
        if self._closed:
            return False
        pause = self._pause
        if pause is None:
            return True
        if self._clock() >= pause.expires:
            log.warning(
                "checkpoint %d %s; resuming",
                pause.checkpoint_id,
                "seal ended (no shard stopped after it)"
                if pause.seal
                else "pause expired (coordinator gone?)",
            )
            self._pause = None
            return True
        return pause.target is not None and self.step < pause.target

    def _wait(self, deadline: float) -> bool:
        """One bounded wait on the condition (also wakes when a pause lease ends).
        Returns False once ``deadline`` has passed, or at once when the shard stops."""
        now = self._clock()
        if now >= deadline or self._closed:
            return False
        until = deadline
        if self._pause is not None:
            until = min(until, self._pause.expires)
        self._cond.wait(max(until - now, 0.001))
        return True

    def _wait_gate(self, patience: float) -> None:
        deadline = self._clock() + patience
        while not self._may_apply():
            if not self._wait(deadline):
                why = "stopping" if self._closed else "paused for a checkpoint"
                raise PSNotReadyError(f"ps shard {self.index} is {why}")

    def _check_grads(self, grads: list[tuple[str, np.ndarray]]) -> None:
        missing = [name for name, _ in grads if name not in self._vars]
        if missing:
            raise PSUninitializedError(f"ps shard {self.index} has no variable(s) {missing}")
        for name, grad in grads:
            if grad.shape != self._vars[name].param.shape:
                raise PSShapeError(
                    f"gradient of {name!r} on shard {self.index} has shape "
                    f"{grad.shape}, the slice has {self._vars[name].param.shape}"
                )

    # ---------------------------------------------------------------- data calls
    def create(
        self, entries: list[tuple[Slice, np.ndarray]], optimizer: dict, patience: float
    ) -> list[str]:
        """Create the variables that do not exist yet (later calls keep what exists);
        returns the names created. Raises PSShapeError when an existing variable has
        another shape, PSConfigError for a bad optimizer, PSNotReadyError."""
        opt = make_optimizer(**optimizer)
        with self._cond:
            self._require_loaded()
            for sl, value in entries:
                if sl.shard != self.index:
                    raise PSProtocolError(
                        f"slice of {sl.name!r} for shard {sl.shard} sent to {self.index}"
                    )
                if value.shape != sl.shape:
                    raise PSShapeError(
                        f"{sl.name!r}: value shape {value.shape} != slice {sl.shape}"
                    )
                have = self._vars.get(sl.name)
                if have is not None and (
                    have.slice.full_shape,
                    have.slice.start,
                    have.slice.stop,
                    have.slice.dtype,
                ) != (sl.full_shape, sl.start, sl.stop, sl.dtype):
                    raise PSShapeError(
                        f"variable {sl.name!r} exists as {have.slice.dtype} "
                        f"{have.slice.full_shape}, not {sl.dtype} {sl.full_shape}"
                    )
            new = [(sl, v) for sl, v in entries if sl.name not in self._vars]
            if not new:
                return []
            self._wait_gate(patience)
            created = []
            for sl, value in new:
                if sl.name in self._vars:
                    continue
                param = np.array(value, dtype=np.dtype(sl.dtype), copy=True)
                self._vars[sl.name] = var = _Var(sl, param, opt.slots(param), opt)
                created.append(var)
            self._record_create(created, opt.config())
            self._bump()
            self._cond.notify_all()
            return [sl.name for sl, _ in new]

    def describe(self) -> Description:
        """Raises PSNotReadyError while restoring."""
        with self._cond:
            self._require_loaded()
            return Description(
                self.index,
                self.num_shards,
                self.mode,
                self.step,
                self.generation,
                tuple(VariableInfo(v.slice, v.optimizer.config()) for v in self._vars.values()),
            )

    def pull(self, names: list[str] | None) -> tuple[Pulled, list[tuple[dict, np.ndarray]]]:
        """The named slices (all when None): their step and generation, and (slice
        metadata, array) pairs. The arrays are the live parameters, which are
        never written in place (optimizers return new arrays), so the caller may send
        them after releasing the lock and still send one consistent state.
        Raises PSUninitializedError naming missing variables, PSNotReadyError."""
        with self._cond:
            self._require_loaded()
            if names is None:
                names = list(self._vars)
            missing = [n for n in names if n not in self._vars]
            if missing:
                raise PSUninitializedError(f"ps shard {self.index} has no variable(s) {missing}")
            return (
                Pulled(self.step, self.generation),
                [(self._vars[n].slice.to_dict(), self._vars[n].param) for n in names],
            )

    def _apply(
        self, grads: list[tuple[str, np.ndarray]], client: str | None = None, seq: int = 0
    ) -> None:
        """One global step (an async push from ``client`` numbered ``seq``, or a sync
        step's average), recorded for a backup first: it is sent while this applies it
        (the shapes were checked, so applying cannot fail half way)."""
        self._record_apply(grads, client, seq)
        for name, grad in grads:
            var = self._vars[name]
            out = var.spare if unshared(var.spare, 1) else None
            var.spare, var.param = var.param, var.optimizer.apply(var.param, grad, var.slots, out)
        self.step += 1
        self._bump()
        self._cond.notify_all()

    def push_async(
        self,
        client: str,
        seq: int,
        grads: list[tuple[str, np.ndarray]],
        patience: float,
        round_id: int = -1,
    ) -> int:
        """Apply one push now; returns the step after it. A repeated ``(client, seq)`` is
        not applied twice. A push of a round older than the newest one pushed for comes
        from a worker the job has moved on without (a host that was cut off and is back,
        still training its stale state): it is refused, never applied.

        Raises:
            PSRoundChangedError: the push's round is older than the job's.
            PSUninitializedError, PSShapeError, PSNotReadyError: as for every push.
        """
        with self._cond:
            self._require_loaded()
            self._check_grads(grads)
            if 0 <= round_id < self._async_round:
                raise PSRoundChangedError(
                    f"a push of round {round_id} refused: the job's workers push for round "
                    f"{self._async_round} (this worker was left out of it)"
                )
            self._async_round = max(self._async_round, round_id)
            if seq <= self._dedup.get(client, 0):
                return self.step
            self._wait_gate(patience)
            self._apply(grads, client, seq)
            self._dedup[client] = seq
            return self.step

    def _sync_reply(self, status: str) -> StepReply:
        return StepReply(status, self.step, self.generation, self._round)

    def _drop_pending(self) -> None:
        self._pending = {}
        self._cond.notify_all()

    def _enter_round(self, round_id: int, generation: str, step: int) -> StepReply | None:
        """Common checks of sync calls; a terminal reply, or None to go on."""
        if generation != self.generation or step > self.step + 1:
            return self._sync_reply(ROLLED_BACK)
        if round_id < self._round:
            return self._sync_reply(SUPERSEDED)
        if round_id > self._round:
            if self._pending:
                log.info(
                    "shard %d: round %d replaces %d; dropping incomplete step %d",
                    self.index,
                    round_id,
                    self._round,
                    self.step + 1,
                )
            self._round, self._round_size = round_id, None
            self._drop_pending()
        if step <= self.step:
            return self._sync_reply(APPLIED)
        return None

    def _try_apply_sync(self) -> None:
        size = self._round_size
        if size is None or len(self._pending) < size or not self._may_apply():
            return
        names: dict[str, None] = {}
        for rank in sorted(self._pending):
            for name, _ in self._pending[rank]:
                names.setdefault(name)
        averaged = []
        for name in names:
            # rank order makes the sum, and so the step, identical on every run
            grads = [
                grad
                for rank in sorted(self._pending)
                for n, grad in self._pending[rank]
                if n == name
            ]
            total = np.array(grads[0], copy=True)
            for grad in grads[1:]:
                total = total + grad
            averaged.append((name, total / size))
        self._pending = {}
        self._apply(averaged)

    def push_sync(
        self,
        round_id: int,
        size: int,
        rank: int,
        step: int,
        generation: str,
        grads: list[tuple[str, np.ndarray]],
        wait: float,
    ) -> StepReply:
        """Contribute ``rank``'s gradients to ``step`` of ``round_id`` and wait up to
        ``wait`` seconds for it to be applied. Raises PSProtocolError for a size or rank that
        contradicts the round, PSUninitializedError, PSShapeError, PSNotReadyError."""
        with self._cond:
            self._require_loaded()
            self._check_grads(grads)
            reply = self._enter_round(round_id, generation, step)
            if reply is not None:
                return reply
            if not 0 <= rank < size:
                raise PSProtocolError(f"rank {rank} is not in a round of size {size}")
            if self._round_size is None:
                self._round_size = size
            elif self._round_size != size:
                raise PSProtocolError(
                    f"round {round_id} was pushed with sizes {self._round_size} and {size}"
                )
            self._pending[rank] = grads
            self._try_apply_sync()
            return self._wait_step(round_id, rank, step, generation, wait)

    def wait_step(
        self, round_id: int, rank: int, step: int, generation: str, wait: float
    ) -> StepReply:
        """Long-poll for a step this rank pushed earlier (same reply as ``push_sync``)."""
        with self._cond:
            self._require_loaded()
            if generation != self.generation:
                return self._sync_reply(ROLLED_BACK)
            if round_id < self._round:
                return self._sync_reply(SUPERSEDED)
            if round_id > self._round:
                return self._sync_reply(UNKNOWN)  # this shard restarted since the push
            return self._wait_step(round_id, rank, step, generation, wait)

    def _wait_step(
        self, round_id: int, rank: int, step: int, generation: str, wait: float
    ) -> StepReply:
        deadline = self._clock() + wait
        while True:
            if generation != self.generation:
                return self._sync_reply(ROLLED_BACK)
            if self.step >= step:
                return self._sync_reply(APPLIED)
            if round_id != self._round:
                return self._sync_reply(SUPERSEDED)
            if rank not in self._pending:
                return self._sync_reply(UNKNOWN)
            self._try_apply_sync()  # a pause lease may have ended
            if self.step >= step:
                continue
            if not self._wait(deadline):
                return self._sync_reply(PENDING)

    # ---------------------------------------------------------------- checkpoint calls
    def status(self) -> ShardStatus:
        with self._cond:
            return ShardStatus(
                self.index,
                self.step,
                self.generation,
                self.loaded,
                self.base,
                self._version,
                self._version == self._clean_version,
            )

    def close(self) -> None:
        """The shard stops: apply nothing more, and end every wait now (a request
        waiting at a closed gate answers "not ready"; its client retries elsewhere or
        later), so that no handler outlives the shard."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def raise_step(self, step: int) -> None:
        """async restart: continue the global step count of the other shards."""
        with self._cond:
            if step > self.step:
                self.step = step
                self._record_meta()
                self._bump()
