"""The checkpoint half of a shard's state: the gate that holds applies so a snapshot
sees one step, aligning shards on the checkpoint's step, snapshots, loading one back,
and the seal of a stop (see ``state.py`` for the rules). ``ShardState`` inherits it;
it works on the attributes ``ShardState`` owns (declared below for type checkers).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from ps.errors import PSProtocolError
from ps.optimizers import Optimizer, make_optimizer
from ps.partition import Slice
from ps.protocol import ShardStatus
from ps.shard.checkpoint_format import SavedVariable, ShardSnapshot

log = logging.getLogger("ps.shard.state")


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


class CheckpointOps:
    """``ShardState``'s checkpoint operations (a part of that class, not on its own)."""

    if TYPE_CHECKING:  # what ShardState owns and this part uses
        index: int
        step: int
        generation: str
        loaded: bool
        base: int | None
        _clock: Callable[[], float]
        _cond: threading.Condition
        _vars: dict[str, _Var]
        _version: int
        _clean_version: int
        _dedup: dict[str, int]
        _pause: _Pause | None

        def _bump(self) -> None: ...
        def _record_meta(self) -> None: ...
        def _record_full(self) -> None: ...
        def _require_loaded(self) -> None: ...
        def _drop_pending(self) -> None: ...
        def _try_apply_sync(self) -> None: ...
        def _wait(self, deadline: float) -> bool: ...
        def status(self) -> ShardStatus: ...

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
                self._record_meta()
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
            self._record_full()

    def adopt_generation(self, generation: str) -> None:
        """Keep the state (it equals the checkpoint) but join ``generation``. Ends a
        pause: rollbacks and checkpoints are serialized on shard 0, so a pause here is
        a seal of a checkpoint for a stop, or the lease of a coordinator that died."""
        with self._cond:
            if generation != self.generation:
                self.generation = generation
                self._record_meta()
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
