"""Every change of a shard's state as an update its backup replays (``--ps-replicas 1``):
what a primary records of each change (``JournalOps``, a part of ``ShardState``), how a
batch of updates travels in one ``Mirror`` call (``encode``/``decode``), and how the
backup applies them (``JournalOps.replay``).

The changes, each numbered by the primary in the order it made them under its state
lock (``mirror.py`` sends them in that order):

* CREATE: new variables, with their initial values and their optimizer;
* APPLY: one global step: the gradients the optimizer applied (an async push's own, or
  a sync step's rank-ordered average), and what a retried push relies on (the async
  push's client and sequence number, the rounds seen);
* META: a new step or generation without an update (a checkpoint's fast-forward, a
  restart continuing the others' count, a rollback's new generation);
* FULL: the whole state (variables, optimizer slots, step, generation, de-duplication
  table): the first update a new backup receives, and what a rollback leaves.

Why the backup replays the update instead of receiving its result: an update travels as
the gradients (a push's own bytes, one array per slice), where the result would be the
new parameters and every optimizer slot the update changed (three arrays per slice for
Adam), copied under the state lock because slots change in place. Replaying gives the
same bits: the optimizers are plain numpy element-wise arithmetic (IEEE-rounded adds,
multiplies, divisions and square roots; Adam's bias correction in Python floats) run by
the same code on the same arrays in the same order, so the backup's state equals the
primary's after every update (``replay`` checks the step it reaches, and a backup that
disagrees is dropped and replaced by a fresh copy).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np

from ps import wire
from ps.errors import PSError, PSReplicaError
from ps.optimizers import make_optimizer
from ps.partition import Slice
from ps.protocol import APPLY, CREATE, FULL, META, MirrorArgs, MirrorOp
from ps.shard.checkpoint_format import SavedVariable, ShardSnapshot
from ps.shard.state_checkpoints import _Var


class Op(NamedTuple):
    """One recorded update: its header (``seq`` 0 until the mirror numbers it) and its
    tensors, (metadata, array) pairs."""

    head: MirrorOp
    tensors: list[tuple[dict, np.ndarray]]


def encode(ops: list[Op]) -> tuple[tuple[MirrorOp, ...], list]:
    """The headers and the payload pieces (uncopied) of one ``Mirror`` call carrying
    ``ops``. Raises PSShapeError for a dtype that cannot travel."""
    tensors = [t for op in ops for t in op.tensors]
    return tuple(op.head for op in ops), wire.encode_parts({}, tensors)


def decode(args: MirrorArgs, body) -> list[Op]:
    """The updates of one ``Mirror`` call (arrays: read-only views of ``body``).

    Raises:
        PSReplicaError: the headers count other tensors than the payload holds.
        PSShapeError: the payload does not parse."""
    _, tensors = wire.decode(body)
    ops, at = [], 0
    for head in args.ops:
        if head.tensors < 0 or at + head.tensors > len(tensors):
            raise PSReplicaError(f"mirror update {head.seq} names tensors the call lacks")
        ops.append(Op(head, tensors[at : at + head.tensors]))
        at += head.tensors
    if at != len(tensors):
        raise PSReplicaError(f"a mirror call carries {len(tensors) - at} tensors of no update")
    return ops


def _full_snapshot(head: MirrorOp, tensors: list[tuple[dict, np.ndarray]]) -> ShardSnapshot:
    """The state a FULL update carries. Raises PSReplicaError when it does not parse."""
    variables: dict[str, SavedVariable] = {}
    try:
        for meta, array in tensors:
            name, slot = meta["var"], meta["slot"]
            if slot is None:
                sl = Slice.from_dict(meta["slice"])
                variables[name] = SavedVariable(sl, array, {}, dict(meta["optimizer"]))
            else:
                variables[name].slots[slot] = array
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PSReplicaError(f"a full copy that does not parse: {exc!r}") from None
    return ShardSnapshot(head.step, variables, dict(head.dedup or {}))


class JournalOps:
    """``ShardState``'s side of replication (a part of that class, not on its own): it
    records each change for ``journal`` (None: nobody mirrors this shard; set by the
    server, called under the state lock, so it must only queue) and replays the changes
    a primary sent."""

    journal: Callable[[Op], None] | None = None

    if TYPE_CHECKING:  # what ShardState owns and this part uses
        index: int
        step: int
        generation: str
        _cond: threading.Condition
        _vars: dict[str, _Var]
        _dedup: dict[str, int]
        _version: int
        _clean_version: int
        _round: int
        _async_round: int

        def _bump(self) -> None: ...
        def _apply(
            self, grads: list[tuple[str, np.ndarray]], client: str | None = None, seq: int = 0
        ) -> None: ...
        def _check_grads(self, grads: list[tuple[str, np.ndarray]]) -> None: ...
        def load(
            self, snapshot: ShardSnapshot | None, checkpoint_id: int | None, generation: str
        ) -> None: ...

    # ---------------------------------------------------------------- recording
    def _record(
        self, kind: str, tensors: list[tuple[dict, np.ndarray]], step: int | None = None, **fields
    ) -> None:
        if self.journal is not None:
            step = self.step if step is None else step
            head = MirrorOp(0, kind, step, self.generation, len(tensors), **fields)
            self.journal(Op(head, tensors))

    def _record_create(self, created: list[_Var], optimizer: dict) -> None:
        # The arrays are the new parameters themselves: never written in place, and the
        # reference the queued update holds keeps their memory from being reused.
        tensors = [({"slice": v.slice.to_dict()}, v.param) for v in created]
        self._record(CREATE, tensors, optimizer=optimizer)

    def _record_apply(
        self, grads: list[tuple[str, np.ndarray]], client: str | None, client_seq: int
    ) -> None:
        """Called before the update is applied (its inputs are all known), so the backup
        receives it while the primary applies it; the step is the one it makes."""
        if self.journal is not None:
            self._record(
                APPLY,
                [({"name": name}, grad) for name, grad in grads],
                step=self.step + 1,
                client=client,
                client_seq=client_seq,
                async_round=self._async_round,
                round=self._round,
            )

    def _record_meta(self) -> None:
        self._record(META, [])

    def _record_full(self) -> None:
        if self.journal is not None:
            self.journal(self.full_op())

    def copy_to(self, start: Callable[[Op], None]) -> None:
        """``start(the state as a FULL update)`` under the state lock: no change is made,
        so none is recorded, between the copy and what ``start`` sets up."""
        with self._cond:
            start(self.full_op())

    def full_op(self) -> Op:
        """The whole state as one FULL update (slots copied: they change in place)."""
        with self._cond:
            tensors: list[tuple[dict, np.ndarray]] = []
            for name, v in self._vars.items():
                meta = {"var": name, "slot": None, "slice": v.slice.to_dict()}
                tensors.append(({**meta, "optimizer": v.optimizer.config()}, v.param))
                tensors += [({"var": name, "slot": k}, a.copy()) for k, a in v.slots.items()]
            head = MirrorOp(
                0,
                FULL,
                self.step,
                self.generation,
                len(tensors),
                async_round=self._async_round,
                round=self._round,
                dedup=dict(self._dedup),
            )
            return Op(head, tensors)

    # ---------------------------------------------------------------- replaying
    def replay(self, op: Op) -> None:
        """Apply one update a primary recorded (on its backup).

        Raises:
            PSReplicaError: this copy does not match the primary's (another step, an
                unknown variable), or the update does not parse."""
        head = op.head
        with self._cond:
            if head.kind == FULL:
                self.load(_full_snapshot(head, op.tensors), None, head.generation)
                self._clean_version = self._version - 1  # equals no checkpoint
            elif head.kind == CREATE:
                self._replay_create(head, op.tensors)
            elif head.kind == APPLY:
                self._replay_apply(head, op.tensors)
            elif head.kind != META:
                raise PSReplicaError(f"unknown mirror update kind {head.kind!r}")
            self.step, self.generation = head.step, head.generation
            self._round = max(self._round, head.round)
            self._async_round = max(self._async_round, head.async_round)
            self._bump()
            self._cond.notify_all()

    def _replay_create(self, head: MirrorOp, tensors: list[tuple[dict, np.ndarray]]) -> None:
        try:
            opt = make_optimizer(**(head.optimizer or {}))
            for meta, value in tensors:
                sl = Slice.from_dict(meta["slice"])
                # a copy: the received bytes belong to the request
                param = np.array(value, dtype=np.dtype(sl.dtype), copy=True)
                self._vars[sl.name] = _Var(sl, param, opt.slots(param), opt)
        except (PSError, KeyError, TypeError, ValueError) as exc:
            raise PSReplicaError(
                f"mirror update {head.seq} creates nothing usable: {exc}"
            ) from None

    def _replay_apply(self, head: MirrorOp, tensors: list[tuple[dict, np.ndarray]]) -> None:
        if self.step != head.step - 1:
            raise PSReplicaError(
                f"the backup of ps shard {self.index} is at step {self.step}; update "
                f"{head.seq} makes step {head.step}"
            )
        try:
            grads = [(str(meta["name"]), grad) for meta, grad in tensors]
            self._check_grads(grads)
        except (PSError, KeyError) as exc:
            raise PSReplicaError(f"mirror update {head.seq} does not fit: {exc}") from None
        self._apply(grads)
        if head.client is not None:
            self._dedup[head.client] = head.client_seq
