"""Training state that survives failures: ``State``, ``ObjectState``, ``NumpyState``.

``commit()`` saves a copy of the state locally (no collective: a commit costs a copy,
not a broadcast) and raises ``HostsUpdatedInterrupt`` when a newer round is pending.
``sync()`` makes every worker of the round adopt the newest commit: the workers
agree (one small allgather) on who holds the most commits, the oldest such worker
broadcasts, and everyone saves the result. Usually that is rank 0, the oldest
survivor; it can be another worker when a failure cut a step short on rank 0 after
that worker had already committed it, so no committed step is lost.

A state takes what it uses of the world as a ``World`` (its size, three collectives, and
whether a newer round is pending), the way Horovod's state takes its broadcast function.
The default is ``elastic.context``, the process's own world; a test or an embedding
passes its own: ``ObjectState(world, epoch=0)``.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import warnings
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Callable, Protocol, cast

import numpy as np

import elastic.context as context
from elastic.errors import HostsUpdatedInterrupt, ReplacedStateWarning
from elastic.hangs.clock import CLOCK

#: a sampler's progress record and the (steps, indices consumed) of the steps taken since
#: the last commit, which the next commit records in it (see ``elastic.sampler``)
PendingProgress = tuple[dict[str, Any], list[tuple[int, int]]]

_active = threading.local()


def current_state() -> State | None:
    """The state that ``@elastic.run`` is running, if any (samplers bind to it)."""
    return getattr(_active, "state", None)


@contextlib.contextmanager
def active(state: State) -> Iterator[None]:
    """Make ``state`` the current state for the duration (``@elastic.run`` does)."""
    previous = current_state()
    _active.state = state
    try:
        yield
    finally:
        _active.state = previous


def sync_root(commit_counts: list[int]) -> int:
    """The rank whose state everyone adopts: most commits, lowest rank on a tie (pure)."""
    best = max(commit_counts)
    return commit_counts.index(best)


class World(Protocol):
    """What a ``State`` uses of the world it trains in (``elastic.context`` is one)."""

    def size(self) -> int: ...

    def broadcast(self, x: Any, root: int = 0) -> np.ndarray: ...

    def broadcast_object(self, obj: Any = None, root: int = 0) -> Any: ...

    def allgather_object(self, obj: Any) -> list: ...

    def pending_round(self) -> int | None: ...


class State:
    """Base of elastic training state. Subclasses implement ``save``, ``restore`` and
    ``_broadcast_from(root)``; ``world`` defaults to ``elastic.context``."""

    def __init__(self, world: World | None = None):
        # None stands for elastic.context, resolved at use: a module reference would
        # make the state impossible to copy or pickle.
        self._world = world
        self._reset_callbacks: list[Callable[[], object]] = []
        self._commits = 0  # commits made in this job, carried through syncs
        self._saved_commits = 0
        self._pending_progress: PendingProgress | None = None

    if TYPE_CHECKING:
        # For type checkers only: a subclass's attributes are the user's (``state.epoch``),
        # known at run time.
        def __getattr__(self, name: str) -> Any: ...

        def __setattr__(self, name: str, value: Any) -> None: ...

    def _world_in_use(self) -> World:
        if self._world is not None:
            return self._world
        # The module is a World; a type checker sees only its __all__, the worker API,
        # which leaves out ``pending_round`` (the library's own).
        return cast(World, context)

    # ---- to implement ----
    def save(self) -> None:
        """Keep a copy of the current values to ``restore`` later."""
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the values of the last ``save``."""
        raise NotImplementedError

    def _broadcast_from(self, root: int) -> None:
        """Replace the current values with ``root``'s (a collective)."""
        raise NotImplementedError

    # ---- what a snapshot of the state uses (``elastic.snapshots``); underscored, as the
    #      public names of a state are its user's attributes ----
    def _snapshot_payload(self) -> Any:
        """The values of the last commit, handed to a snapshot that reads them from
        another thread: they must not change until ``_snapshot_returned`` gives them
        back (a subclass that cannot say: NotImplementedError, and no snapshots)."""
        raise NotImplementedError

    def _snapshot_returned(self, payload: Any) -> None:
        """The snapshot is done with ``payload`` (from the snapshot's thread)."""

    def _snapshot_values(self) -> Any:
        """The values of the last commit as a snapshot holds them, to look at on the
        training thread and let go at once (what a snapshot's structure is checked
        against before it loads; unlike ``_snapshot_payload`` nothing is lent). A
        subclass that cannot say: NotImplementedError, and no structure is checked."""
        raise NotImplementedError

    def _load_snapshot(self, values: Any, commits: int) -> None:
        """Take ``values`` (a ``_snapshot_payload`` written to disk and read back) as the
        last commit, ``commits`` commits into the training, and restore it. Attributes
        the snapshot does not hold keep the values the script gave them."""
        raise NotImplementedError

    # ---- the contract ----
    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], object]]) -> None:
        """Functions called (no arguments) after every re-form, e.g. to rescale a learning rate."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Call the reset callbacks (``@elastic.run`` does, after every re-form)."""
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Mark a point that survives failures; raises HostsUpdatedInterrupt when a newer
        round is pending (after saving, so nothing is lost)."""
        CLOCK.enter()  # a commit is progress (the hang watchdog: elastic.hangs.clock)
        try:
            pending = self._pending_progress
            if pending is not None:
                progress, steps = pending
                progress["offsets"].update(steps)
                steps.clear()
            self._commits += 1
            self._saved_commits = self._commits
            self.save()
            if self._world is None:  # the process's own world: its runtime reports progress
                context.note_commit(self._commits, self if current_state() is self else None)
        finally:
            CLOCK.committed()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt if a newer round is pending (no I/O: the round watch
        has already seen it)."""
        pending = self._world_in_use().pending_round()
        if pending is not None:
            raise HostsUpdatedInterrupt(f"round {pending} is pending")

    def sync(self) -> None:
        """Every worker adopts the newest commit of the round (collective): with
        snapshots (``--checkpoint-dir``), the newest snapshot a member can read counts
        as a commit its reader holds (``elastic.snapshots``).

        Raises WorkerLostError if the round breaks meanwhile."""
        world = self._world_in_use()
        self._pending_progress = None
        snapshots = context.snapshots() if self._world is None and current_state() is self else None
        if snapshots is not None:
            self._commits = snapshots.adopt_newest(self, world, context.rank())
        elif world.size() > 1:
            counts = world.allgather_object(self._commits)
            root = sync_root(counts)
            self._broadcast_from(root)
            self._commits = counts[root]
        self._saved_commits = self._commits
        self.save()

    def _restore_commits(self) -> None:
        self._commits = self._saved_commits
        self._pending_progress = None


_INTERNAL = (
    "_world",
    "_reset_callbacks",
    "_commits",
    "_saved_commits",
    "_pending_progress",
    "_saved",
    "_warned",
)


def replaced_behind_the_loop(value: Any) -> bool:
    """Whether ``value`` is an object a training loop keeps references to, which
    ``ObjectState`` would swap for a copy on restore and sync (pure): anything with
    ``state_dict()`` and ``load_state_dict()`` (torch modules, optimizers, LR schedulers,
    samplers, grad scalers), and any object of torch (a tensor, a parameter)."""
    kind = type(value)
    if kind.__module__ == "torch" or kind.__module__.startswith("torch."):
        return True
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


class ObjectState(State):
    """State made of picklable attributes: ``ObjectState(epoch=0, history=[])``; read and
    assign them as ``state.epoch``. Synced with ``broadcast_object``. The world, if
    given, comes first and by position only, so every keyword stays an attribute."""

    def __init__(self, world: World | None = None, /, **attrs: Any):
        super().__init__(world)
        self.__dict__.update(attrs)
        self._saved: dict[str, Any] = {}
        self._warned: set[str] = set()
        self.save()

    def _values(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in _INTERNAL}

    def _warn_of_replaced(self, values: dict) -> None:
        """A ``ReplacedStateWarning`` (once per attribute) for each object that restore
        and sync would replace behind the loop's back."""
        for name, value in values.items():
            if name not in self._warned and replaced_behind_the_loop(value):
                self._warned.add(name)
                kind = f"{type(value).__module__}.{type(value).__qualname__}"
                warnings.warn(
                    f"{type(self).__name__} attribute {name!r} holds a {kind}: restore() "
                    "and sync() replace it with a copy, so the object your training loop "
                    "holds (and anything built on it, e.g. an optimizer over a model's "
                    "parameters) would go on training a stale replica. Use "
                    f"elastic.torch.TorchState({name}=...), which restores and syncs it "
                    "in place",
                    ReplacedStateWarning,
                    stacklevel=4,  # the user's line: its ObjectState(...) or commit()
                )

    def save(self) -> None:
        values = self._values()
        self._warn_of_replaced(values)
        self._saved = copy.deepcopy(values)

    def restore(self) -> None:
        for name in list(self._values()):
            if name not in self._saved:
                delattr(self, name)
        self.__dict__.update(copy.deepcopy(self._saved))
        self._restore_commits()

    def _snapshot_payload(self) -> dict:
        return self._saved  # a fresh copy at every save, never changed in place

    def _snapshot_values(self) -> dict:
        return self._saved

    def _load_snapshot(self, values: Any, commits: int) -> None:
        self._saved = {**self._saved, **values}
        self.restore()
        self._commits = self._saved_commits = commits

    def _broadcast_from(self, root: int) -> None:
        self.__dict__.update(self._world_in_use().broadcast_object(self._values(), root=root))


class NumpyState(ObjectState):
    """Like ``ObjectState``, but ndarray attributes travel as arrays (``broadcast``), the
    rest as one object. Arrays are copied on save, so in-place updates (``w -= g``) are safe."""

    def _broadcast_from(self, root: int) -> None:
        world = self._world_in_use()
        values = self._values()
        arrays = {k: v for k, v in values.items() if isinstance(v, np.ndarray)}
        # Receivers learn names, shapes and dtypes first: a new worker may not even have them.
        layout = world.broadcast_object(
            (
                {k: (v.shape, v.dtype.str) for k, v in sorted(arrays.items())},
                {k: v for k, v in values.items() if k not in arrays},
            ),
            root=root,
        )
        shapes, objects = layout
        for name, (shape, dtype) in shapes.items():
            buffer = arrays.get(name)
            if buffer is None or buffer.shape != tuple(shape) or buffer.dtype.str != dtype:
                buffer = np.zeros(shape, dtype=np.dtype(dtype))
            self.__dict__[name] = world.broadcast(buffer, root=root)
        self.__dict__.update(objects)


__all__ = ["State", "ObjectState", "NumpyState"]
