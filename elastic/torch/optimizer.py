"""``DistributedOptimizer``: the user's optimizer, with gradients averaged over the
world (in fused buckets started from backward hooks) before every ``step()``.

The optimizer object itself is made distributed (its class becomes a subclass of its
own class with ``synchronize()`` and friends), not wrapped in a copy: the model, the
learning-rate schedulers and ``TorchState`` keep one optimizer object, so nothing can
train a stale replica. ``step()`` synchronizes through an optimizer step pre-hook, so
it also does when an LR scheduler has wrapped ``optimizer.step``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

import torch

from elastic.torch.reducer import GradientReducer, StepTimeline

_classes: dict[type, type] = {}


class _Distributed:
    """Methods added to a distributed optimizer (mixed in before its own class)."""

    _elastic_reducer: GradientReducer

    def synchronize(self) -> None:
        """Wait until this step's gradients are reduced (launching the buckets that are
        still waiting); ``p.grad`` then holds the world's average (or sum). Call it
        before reading gradients (e.g. clipping); ``step()`` calls it too.

        Raises WorkerLostError when a worker was lost during the reduction."""
        self._elastic_reducer.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """``step()`` inside does not synchronize (after an explicit ``synchronize()``,
        as in Horovod; harmless here, where a second synchronize does nothing)."""
        self._elastic_skip = True
        try:
            yield
        finally:
            self._elastic_skip = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As ``torch.optim.Optimizer.zero_grad``.

        Raises RuntimeError between ``backward()`` and ``step()``/``synchronize()``:
        gradients of this step are being reduced (``reset_step()`` drops them)."""
        reducer = self._elastic_reducer
        if reducer.in_step and not reducer.synchronized:
            raise RuntimeError(
                "zero_grad() after backward() and before step() or "
                "synchronize(): the step's gradients are being reduced; "
                "call step(), or reset_step() to drop them"
            )
        super().zero_grad(set_to_none=set_to_none)  # type: ignore[misc]

    @property
    def backward_passes_per_step(self) -> int:
        """Backward passes accumulated before each ``step()``; settable between steps
        (e.g. to a global batch's micro-batches in this step, so that buckets leave
        during the last backward pass).

        Raises ValueError below 1, RuntimeError when set within a step."""
        return self._elastic_reducer.passes

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, passes: int) -> None:
        self._elastic_reducer.set_passes(passes)

    @property
    def gradient_op(self) -> str:
        """How gradients combine over the world: "average" or "sum"."""
        return self._elastic_reducer.op

    def reset_step(self) -> None:
        """Drop the step in flight (after a failure cut it short, or to skip a step on
        every rank); ``TorchState`` calls it on restore and sync."""
        self._elastic_reducer.reset_step()

    @property
    def timeline(self) -> StepTimeline:
        """When this step's hooks fired and its buckets were reduced."""
        return self._elastic_reducer.timeline

    @property
    def last_timeline(self) -> StepTimeline | None:
        """The timeline of the last step that finished synchronizing."""
        return self._elastic_reducer.last_timeline

    @property
    def buckets(self):
        """The bucket plan (parameter indices in ``named_parameters`` order)."""
        return self._elastic_reducer.buckets


if TYPE_CHECKING:

    class DistributedTorchOptimizer(_Distributed, torch.optim.Optimizer):
        """What ``DistributedOptimizer`` returns, for type checkers: a torch optimizer
        with the methods above (at run time, a subclass of the user's optimizer class)."""


def _distributed_class(cls: type) -> type:
    if cls not in _classes:
        _classes[cls] = type(f"Distributed{cls.__name__}", (_Distributed, cls), {})
    return _classes[cls]


def _ordered_params(
    optimizer: torch.optim.Optimizer, named_parameters: Iterable | None
) -> list[torch.nn.Parameter]:
    """The optimizer's trainable parameters in the model's registration order (from
    ``named_parameters`` when given, else the param groups' order).

    Raises ValueError for duplicate names or an optimizer parameter missing from
    ``named_parameters``."""
    in_optimizer = [
        p for group in optimizer.param_groups for p in group["params"] if p.requires_grad
    ]
    if named_parameters is None:
        return list(dict.fromkeys(in_optimizer))
    named = list(named_parameters)
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        raise ValueError("named_parameters has duplicate names")
    wanted = {id(p) for p in in_optimizer}
    ordered, seen = [], set()
    for _, p in named:
        if id(p) in wanted and id(p) not in seen:
            ordered.append(p)
            seen.add(id(p))
    missing = wanted - seen
    if missing:
        raise ValueError(
            f"{len(missing)} parameter(s) of the optimizer are not in named_parameters"
        )
    return ordered


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters=None,
    op: str = "average",
    backward_passes_per_step: int = 1,
    compression: str | None = None,
    bucket_bytes: int | None = None,
) -> DistributedTorchOptimizer:
    """Make ``optimizer`` distributed and return it (the same object).

    ``named_parameters``: ``model.named_parameters()``, fixing the bucket order (reverse
    registration order, as DDP); ``op``: "average" or "sum"; ``backward_passes_per_step``:
    backward passes accumulated locally before each ``step()``; ``compression``: None
    or "fp16" (gradients travel as float16); ``bucket_bytes``: fused bucket size
    (default 25 MiB).

    Raises TypeError when ``optimizer`` is not a torch optimizer or is already
    distributed, ValueError for bad options."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(optimizer, _Distributed):
        raise TypeError("this optimizer is already a DistributedOptimizer")
    reducer = GradientReducer(
        _ordered_params(optimizer, named_parameters),
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        compression=compression,
        bucket_bytes=bucket_bytes,
    )
    optimizer.__class__ = _distributed_class(type(optimizer))
    optimizer._elastic_reducer = reducer  # type: ignore[attr-defined]
    optimizer._elastic_skip = False  # type: ignore[attr-defined]

    def before_step(opt, args, kwargs):
        if not opt._elastic_skip:
            reducer.synchronize()

    def after_step(opt, args, kwargs):
        reducer.end_step()

    optimizer.register_step_pre_hook(before_step)
    optimizer.register_step_post_hook(after_step)
    return cast("DistributedTorchOptimizer", optimizer)
