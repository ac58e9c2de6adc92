"""``TorchState``: a ``State`` holding a model, an optimizer, LR schedulers, a sampler
and plain attributes, restored and synced **in place**.

Attributes are handled by what they are:

* objects with ``state_dict()``/``load_state_dict()`` (modules, optimizers, LR
  schedulers, ``elastic.torch.ElasticSampler``, grad scalers, ...): ``commit()`` keeps a
  copy of their state dict; ``restore()`` and ``sync()`` load into the same objects,
  so every reference the training loop holds trains the restored state;
* tensors: copied on commit, written back into the same tensor;
* anything else: deep-copied, as in ``ObjectState``.

``commit()`` costs a memory copy: no collective, no disk. ``sync()`` follows the
``State`` protocol (the worker holding the most commits broadcasts); modules travel as
fused tensor broadcasts, optimizer state likewise, the rest as one pickled object.

A snapshot (``--checkpoint-dir``) reads the committed copy from its own thread: while
it is lent, the next commit copies into a spare copy (the one the snapshot before gave
back) instead of into the lent one, so a snapshot costs no copy on the training thread.
"""

from __future__ import annotations

import copy
import sys
import threading
from typing import TYPE_CHECKING, Any

import torch

from elastic import State
from elastic.torch import _backend
from elastic.torch.params import (
    broadcast_optimizer_state,
    broadcast_parameters,
    broadcast_state_dict,
)

if TYPE_CHECKING:
    from elastic.torch.sharded.parts import ShardedParts


def _has_state_dict(value: Any) -> bool:
    # Any: the objects are duck-typed (modules, optimizers, schedulers, samplers).
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


def _copy_into(saved: Any, value: Any) -> Any:
    """A copy of ``value`` (nested dicts/lists of tensors and plain values), reusing the
    tensors of ``saved`` (the previous copy) where shapes and dtypes still match."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if (
            isinstance(saved, torch.Tensor)
            and saved.shape == value.shape
            and saved.dtype == value.dtype
            and saved.device == value.device
        ):
            return saved.copy_(value)
        return value.clone()
    if isinstance(value, dict):
        before = saved if isinstance(saved, dict) else {}
        return {k: _copy_into(before.get(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        old = saved if isinstance(saved, (list, tuple)) and len(saved) == len(value) else None
        return type(value)(
            _copy_into(old[i] if old is not None else None, v) for i, v in enumerate(value)
        )
    return copy.deepcopy(value)


def _sharded_parts(attrs: dict[str, Any]) -> ShardedParts | None:
    """The sharded modules and optimizers among ``attrs`` (FSDP2's DTensor parameters),
    or None when there are none."""
    if "torch.distributed.tensor" not in sys.modules:
        return None  # no DTensor exists yet, and FSDP2's import costs 1.5 s: not for all
    from elastic.torch.sharded.fsdp import is_sharded
    from elastic.torch.sharded.parts import ShardedParts, is_sharded_optimizer

    modules = {k: v for k, v in attrs.items() if isinstance(v, torch.nn.Module) and is_sharded(v)}
    optimizers = {k: v for k, v in attrs.items() if is_sharded_optimizer(v)}
    return ShardedParts(modules, optimizers) if modules else None


def _clone(value: Any) -> Any:
    """A copy that shares no tensor with ``value`` (loaded objects keep what they get)."""
    return _copy_into(None, value)


class TorchState(State):
    """``TorchState(model=model, optimizer=optimizer, scheduler=..., sampler=...,
    epoch=0, ...)``; read and assign attributes as ``state.epoch``."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__()
        # What the State machinery keeps on the instance is not training state.
        self._own = frozenset(self.__dict__) | {"_own", "_saved", "_lent", "_spare", "_loan"}
        self._own |= {"_sharded"}
        self.__dict__.update(attrs)
        self._sharded = _sharded_parts(attrs)
        self._saved: dict[str, Any] = {}
        self._loan = threading.Lock()  # _lent and _spare change on the snapshot's thread too
        self._lent: dict[str, Any] | None = None  # the committed copy a snapshot reads
        self._spare: dict[str, Any] = {}  # a copy a snapshot gave back, to copy into next
        self.save()

    def _values(self) -> dict[str, Any]:
        """The attributes kept as whole replicas (the sharded ones have ``_sharded``)."""
        skip = self._own | (self._sharded.names if self._sharded is not None else frozenset())
        return {k: v for k, v in self.__dict__.items() if k not in skip}

    # ---- State ----
    def save(self) -> None:
        with self._loan:
            saved = self._saved
            if saved is self._lent:  # a snapshot still reads it: copy into the spare
                saved, self._spare = self._spare, {}
        self._saved = {}
        for name, value in self._values().items():
            if isinstance(value, torch.Tensor):
                self._saved[name] = ("tensor", _copy_into(saved.get(name, (None, None))[1], value))
            elif _has_state_dict(value):
                self._saved[name] = (
                    "state_dict",
                    _copy_into(saved.get(name, (None, None))[1], value.state_dict()),
                )
            else:
                self._saved[name] = ("value", copy.deepcopy(value))
        if self._sharded is not None:  # a version of its own: the sync may need it
            self._sharded.save(self._commits, _clone(self._saved))

    def restore(self) -> None:
        self._reset_optimizers()
        if self._sharded is not None:
            self._sharded.load_own(self._sharded.latest())
        for name in list(self._values()):
            if name not in self._saved:
                delattr(self, name)
        for name, (kind, saved) in self._saved.items():
            current: Any = self.__dict__.get(name)
            if (
                kind == "tensor"
                and isinstance(current, torch.Tensor)
                and current.shape == saved.shape
                and current.dtype == saved.dtype
            ):
                with torch.no_grad():
                    current.copy_(saved)
            elif kind == "tensor":
                self.__dict__[name] = saved.clone()
            elif kind == "state_dict" and isinstance(current, torch.nn.Module):
                current.load_state_dict(saved)  # copies into the module's own tensors
            elif kind == "state_dict" and _has_state_dict(current):
                current.load_state_dict(_clone(saved))  # optimizers keep what they load
            else:
                self.__dict__[name] = copy.deepcopy(saved)
        self._restore_commits()

    def sync(self) -> None:
        self._reset_optimizers()
        if self._sharded is None:
            super().sync()
            return
        # Sharded: the commit adopted is the newest whose every part is held, and the
        # other attributes come with it (``elastic.torch.sharded.parts``).
        version = self._sharded.sync()
        self._saved = version.saved
        self._pending_progress = None
        self._saved_commits = version.commit
        self.restore()
        self.save()

    def _snapshot_payload(self) -> dict[str, Any]:
        if self._sharded is not None:
            raise NotImplementedError("snapshots of sharded state (et.fully_shard)")
        with self._loan:
            self._lent = self._saved
        return self._saved

    def _snapshot_values(self) -> dict[str, Any]:
        if self._sharded is not None:
            raise NotImplementedError("snapshots of sharded state (et.fully_shard)")
        return self._saved  # looked at, not lent: no spare copy is made

    def _snapshot_returned(self, payload: Any) -> None:
        with self._loan:
            lent = self._lent
            if lent is not None and payload is lent:
                self._lent = None
                if lent is not self._saved:
                    self._spare = lent

    def _load_snapshot(self, values: Any, commits: int) -> None:
        self._saved = {**self._saved, **values}
        self.restore()
        self._commits = self._saved_commits = commits

    def _broadcast_from(self, root: int) -> None:
        values = self._values()
        rest: dict[str, Any] = {}
        for name in sorted(values):
            value = values[name]
            if isinstance(value, torch.nn.Module):
                broadcast_parameters(value.state_dict(), root_rank=root)
            elif isinstance(value, torch.optim.Optimizer):
                broadcast_optimizer_state(value, root_rank=root)
            elif _has_state_dict(value):
                rest[name] = ("state_dict", value.state_dict())
            else:
                rest[name] = ("value", value)  # tensors among them travel fused
        if _backend.world_rank() == root:
            broadcast_state_dict(rest, root)
            return
        for name, (kind, value) in broadcast_state_dict(None, root).items():
            current: Any = self.__dict__.get(name)
            if kind == "state_dict" and _has_state_dict(current):
                current.load_state_dict(value)
            elif (
                isinstance(value, torch.Tensor)
                and isinstance(current, torch.Tensor)
                and current.shape == value.shape
                and current.dtype == value.dtype
            ):
                with torch.no_grad():
                    current.copy_(value)
            else:
                self.__dict__[name] = value

    def _reset_optimizers(self) -> None:
        """A step cut short by a failure leaves reductions in flight: drop them."""
        for value in self._values().values():
            reset = getattr(value, "reset_step", None)
            if isinstance(value, torch.optim.Optimizer) and callable(reset):
                reset()
