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
from dataclasses import dataclass

import numpy as np

from elastic.ps.errors import PSNotReadyError, PSProtocolError, PSShapeError, PSUninitializedError
from elastic.ps.memory import unshared
from elastic.ps.optimizers import Optimizer, make_optimizer
from elastic.ps.partition import Slice
from elastic.ps.protocol import (
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
from elastic.ps.shard.checkpoint import SavedVariable, ShardSnapshot

log = logging.getLogger("elastic.ps.shard.state")


def initial_generation(checkpoint_id: int | None) -> str:
    """The generation every shard agrees on after loading ``checkpoint_id`` at start."""
    return f"c{checkpoint_id or 0}"


class _Var:
    """One slice. ``param`` is replaced by each update, never written; ``spare`` is the
    previous array, reused as the next update's output once no pull or checkpoint still
    reads it (saves faulting in fresh pages every step)."""

    __slots__ = ("optimizer", "param", "slice", "slots", "spare")

    def __init__(self, sl: Slice, param: np.ndarray, slots: dict, optimizer: Optimizer):
        self.slice, self.param, self.slots, self.optimizer = sl, param, slots, optimizer
        self.spare: np.ndarray | None = None


@dataclass
class _Pause:
    checkpoint_id: int
    expires: float
    target: int | None = None
    seal: bool = False  # a checkpoint for a stop: no apply after its snapshot either


class ShardState:
    """State of shard ``index`` of ``num_shards`` in ``mode`` ("async" or "sync")."""

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
            for sl, value in new:
                if sl.name in self._vars:
                    continue
                param = np.array(value, dtype=np.dtype(sl.dtype), copy=True)
                self._vars[sl.name] = _Var(sl, param, opt.slots(param), opt)
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

    def _apply(self, grads: list[tuple[str, np.ndarray]]) -> None:
        for name, grad in grads:
            var = self._vars[name]
            out = var.spare if unshared(var.spare, 1) else None
            var.spare, var.param = var.param, var.optimizer.apply(var.param, grad, var.slots, out)
        self.step += 1
        self._bump()
        self._cond.notify_all()

    def push_async(
        self, client: str, seq: int, grads: list[tuple[str, np.ndarray]], patience: float
    ) -> int:
        """Apply one push now; returns the step after it. A repeated ``(client, seq)`` is
        not applied twice. Raises PSUninitializedError, PSShapeError, PSNotReadyError."""
        with self._cond:
            self._require_loaded()
            self._check_grads(grads)
            if seq <= self._dedup.get(client, 0):
                return self.step
            self._wait_gate(patience)
            self._apply(grads)
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

    def prepare(self, checkpoint_id: int, lease: float, seal: bool = False) -> ShardStatus:
        """Close the gate (no apply starts; none is running since applies hold the lock)
        for at most ``lease`` seconds; returns ``status()``. With ``seal`` (a checkpoint
        for a stop) the gate stays closed after the snapshot too, for another ``lease``
        (the shards exit meanwhile; if none does, training goes on). Raises
        PSNotReadyError."""
        with self._cond:
            self._require_loaded()
            self._pause = _Pause(checkpoint_id, self._clock() + lease, seal=seal)
        return self.status()

    def sealed_at(self) -> int | None:
        """The checkpoint this shard's state is sealed at (a checkpoint for a stop paused
        it, and it equals that checkpoint's ``base``), or None."""
        with self._cond:
            pause = self._pause
            if pause is None or not pause.seal or self._clock() >= pause.expires:
                return None
            return self.base if self._version == self._clean_version else None

    def align(self, checkpoint_id: int, target: int, timeout: float, fast_forward: bool) -> int:
        """Let applies through until ``step == target`` (pushes that reached other shards
        before the pause), waiting at most ``timeout``. With ``fast_forward`` (async) a
        shard still behind then sets its step to ``target``. Returns the step. Raises
        PSProtocolError when this checkpoint's pause is gone (its lease ended)."""
        with self._cond:
            pause = self._pause
            if pause is None or pause.checkpoint_id != checkpoint_id:
                raise PSProtocolError(
                    f"shard {self.index} is not paused for checkpoint {checkpoint_id}"
                )
            pause.target = target
            pause.expires = max(pause.expires, self._clock() + timeout + 1.0)
            self._cond.notify_all()
            deadline = self._clock() + timeout
            while self.step < target:
                self._try_apply_sync()
                if self.step >= target or not self._wait(deadline):
                    break
            if self.step < target and fast_forward:
                log.info(
                    "shard %d: step %d -> %d for checkpoint %d (a push that reached other "
                    "shards did not arrive here)",
                    self.index,
                    self.step,
                    target,
                    checkpoint_id,
                )
                self.step = target
                self._bump()
            return self.step

    def snapshot(self, checkpoint_id: int, lease: float | None = None) -> ShardSnapshot:
        """Copy the state and reopen the gate; a seal keeps it closed, for ``lease``
        seconds from now (None: until the pause's lease ends). Raises PSProtocolError
        when the pause for ``checkpoint_id`` is gone."""
        with self._cond:
            pause = self._pause
            if pause is None or pause.checkpoint_id != checkpoint_id:
                raise PSProtocolError(
                    f"shard {self.index} is not paused for checkpoint {checkpoint_id}"
                )
            snap = ShardSnapshot(
                self.step,
                {
                    # parameters are replaced, never modified: no copy needed; slots are copied
                    name: SavedVariable(
                        v.slice,
                        v.param,
                        {k: a.copy() for k, a in v.slots.items()},
                        v.optimizer.config(),
                    )
                    for name, v in self._vars.items()
                },
                dict(self._dedup),
            )
            self.base, self._clean_version = checkpoint_id, self._version
            if pause.seal:
                pause.target = None
                if lease is not None:
                    pause.expires = self._clock() + lease
            else:
                self._pause = None
                self._try_apply_sync()
            self._cond.notify_all()
            return snap

    def abort(self, checkpoint_id: int) -> None:
        with self._cond:
            if self._pause is not None and self._pause.checkpoint_id == checkpoint_id:
                self._pause = None
                self._try_apply_sync()
                self._cond.notify_all()

    def load(
        self, snapshot: ShardSnapshot | None, checkpoint_id: int | None, generation: str
    ) -> None:
        """Replace the whole state (None: empty at step 0) and start ``generation``.
        Raises PSConfigError for an optimizer config it cannot rebuild."""
        variables = {}
        if snapshot is not None:
            for name, sv in snapshot.variables.items():
                opt = make_optimizer(**sv.optimizer)
                param = np.array(sv.param, copy=True)
                slots = opt.slots(param)
                for k, a in sv.slots.items():
                    slots[k] = np.array(
                        a, dtype=slots[k].dtype if k in slots else a.dtype, copy=True
                    )
                variables[name] = _Var(sv.slice, param, slots, opt)
        with self._cond:
            self._vars = variables
            self.step = snapshot.step if snapshot is not None else 0
            self._dedup = dict(snapshot.dedup) if snapshot is not None else {}
            self.generation = generation
            self.base = checkpoint_id
            self._bump()
            self._clean_version = self._version
            self._pause = None
            self.loaded = True
            self._drop_pending()

    def adopt_generation(self, generation: str) -> None:
        """Keep the state (it equals the checkpoint) but join ``generation``. Ends a
        pause: rollbacks and checkpoints are serialized on shard 0, so a pause here is
        a seal of a checkpoint for a stop, or the lease of a coordinator that died."""
        with self._cond:
            if generation != self.generation:
                self.generation = generation
                self._drop_pending()
            if self._pause is not None:
                self._pause = None
                self._try_apply_sync()
                self._cond.notify_all()

    def at_checkpoint(self, checkpoint_id: int | None) -> bool:
        """True when the state is exactly what loading ``checkpoint_id`` would give."""
        with self._cond:
            return (
                self.loaded and self.base == checkpoint_id and self._version == self._clean_version
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
                self._bump()
