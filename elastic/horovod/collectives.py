"""Horovod's collectives with Horovod's signatures, run by ``elastic.torch``'s.

``allreduce``/``allreduce_``, ``allgather``, ``broadcast``/``broadcast_``,
``broadcast_object``, ``allgather_object``, ``barrier``, ``broadcast_parameters`` and
``broadcast_optimizer_state`` take what Horovod's take and return what they return; the
work is ``elastic.torch``'s (CPU tensors share memory with the transport, CUDA tensors
are staged through pinned host memory).

Two things differ, both said in the README's "Coming from Horovod":

* ``name=`` is accepted and unused. Horovod matches a collective across ranks by its
  name; ours are matched by call order, so every rank must call the same collectives
  in the same order (scripts that call them synchronously, as Horovod's examples do,
  already do). A rank that calls another collective gets ``CollectiveMismatchError``.
* The results carry no autograd history (Horovod's tensor collectives are
  differentiable).

Every function raises ``HorovodInternalError`` (our ``WorkerLostError``) when a worker
of the round is lost under it, which ``@hvd.elastic.run`` handles.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

import elastic
import elastic.torch as et
from elastic.horovod.compression import Compression, Compressor
from elastic.horovod.ops import ReduceOp, op_name


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """A new tensor: ``tensor`` reduced over all workers with ``op`` (default
    ``hvd.Average``; ``average=False`` is the older spelling of ``hvd.Sum``), multiplied
    by ``prescale_factor`` before and ``postscale_factor`` after, sent compressed by
    ``compression``.

    Raises:
        HorovodUnsupportedError: ``op`` is ``hvd.Adasum`` or ``hvd.Product``.
        ValueError: both ``op`` and ``average`` are given.
        TypeError: ``op`` is not a Horovod reduction, or ``tensor`` not a tensor.
        HorovodInternalError: a worker was lost during the collective.
    """
    how = op_name(op, average)
    sent, ctx = compression.compress(tensor)
    if prescale_factor != 1.0:
        sent = sent * prescale_factor
    result = et.allreduce(sent, op=how)
    if postscale_factor != 1.0:
        result = result * postscale_factor
    return compression.decompress(result, ctx)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """``tensor`` reduced over all workers in place (as ``allreduce``); returns it.

    Raises:
        HorovodUnsupportedError: ``op`` is ``hvd.Adasum`` or ``hvd.Product``.
        ValueError: both ``op`` and ``average`` are given.
        TypeError: ``op`` is not a Horovod reduction, or ``tensor`` not a tensor.
        HorovodInternalError: a worker was lost during the collective.
    """
    how = op_name(op, average)
    with torch.no_grad():
        if prescale_factor != 1.0:
            tensor.mul_(prescale_factor)
        et.allreduce_(tensor, op=how)
        if postscale_factor != 1.0:
            tensor.mul_(postscale_factor)
    return tensor


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Every worker's ``tensor`` concatenated on dimension 0 in rank order (the first
    dimensions may differ between workers).

    Raises:
        HorovodInternalError: a worker was lost during the collective.
    """
    return et.allgather(tensor)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """A new tensor holding ``root_rank``'s ``tensor`` on every worker.

    Raises:
        ValueError: ``root_rank`` is not a rank of the round.
        HorovodInternalError: a worker was lost during the collective.
    """
    return et.broadcast(tensor, root=root_rank)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """``root_rank``'s ``tensor`` written into every worker's ``tensor``; returns it.

    Raises:
        ValueError: root's tensor has another shape or dtype.
        HorovodInternalError: a worker was lost during the collective.
    """
    return et.broadcast_(tensor, root=root_rank)


def broadcast_object(obj: Any = None, root_rank: int = 0, name: str | None = None) -> Any:
    """``root_rank``'s picklable ``obj`` on every worker.

    Raises:
        HorovodInternalError: a worker was lost during the collective.
    """
    return et.broadcast_object(obj, root=root_rank)


def allgather_object(obj: Any, name: str | None = None) -> list:
    """Every worker's picklable ``obj``, in rank order.

    Raises:
        HorovodInternalError: a worker was lost during the collective.
    """
    return et.allgather_object(obj)


def barrier() -> None:
    """Return once every worker of the round has called it.

    Raises:
        HorovodInternalError: a worker was lost meanwhile.
    """
    elastic.barrier()


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable, root_rank: int, prefix: str | None = None
) -> None:
    """Write ``root_rank``'s values into every worker's ``params`` in place:
    ``model.state_dict()``, ``model.named_parameters()`` or a list of tensors.
    ``prefix`` (Horovod's names for the broadcasts) is unused.

    Raises:
        ValueError: the workers hold other names, shapes or dtypes (on every worker
            alike, before any tensor is sent).
        HorovodInternalError: a worker was lost during the broadcast.
    """
    et.broadcast_parameters(params, root_rank=root_rank)


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer,
    root_rank: int,
    prefix: str = "Parameter.",
    model: Any = None,
) -> None:
    """Load ``root_rank``'s optimizer state (slots, step counts, every param group's
    hyper-parameters) into every worker's ``optimizer``, in place. ``prefix`` and
    ``model`` (Horovod's names for the broadcasts) are unused.

    Raises:
        ValueError: the workers' optimizers have other parameter layouts.
        HorovodInternalError: a worker was lost during the broadcast.
    """
    et.broadcast_optimizer_state(optimizer, root_rank=root_rank)


__all__ = [
    "allreduce",
    "allreduce_",
    "allgather",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "allgather_object",
    "barrier",
    "broadcast_parameters",
    "broadcast_optimizer_state",
]
