"""Collectives on torch tensors: ``allreduce``, ``broadcast``, ``allgather`` and their
in-place forms ``allreduce_`` and ``broadcast_``.

Each tensor goes through its plane (``elastic.torch.plane``): the round's process
group (NCCL for CUDA tensors by default; gloo when asked for) or the ring. On the ring,
a contiguous CPU tensor is handed to the transport as the numpy array sharing its
memory (no copy in); results come back as tensors sharing the transport's result
array (no copy out); CUDA tensors are staged through pinned host buffers
(``_staging``). On a group, a collective runs on a fresh copy on the group's device (an
aborted one never writes into the caller's tensor). The in-place forms write into the
caller's tensor. All ranks must call the same collectives in the same order, as for
``elastic.allreduce``; on a group, a call that differs between ranks is not detected
(as in torch.distributed) but for ``allgather``'s shapes.

Raises (every function): ``WorkerLostError`` when a peer is lost or the round is
re-forming, ``CollectiveMismatchError`` when ranks disagree on the call, ``ValueError``
for an unknown op or root, ``TypeError`` for a dtype the transport cannot carry,
``BackendUnavailableError`` when the torch backend asked for cannot run here.
"""

from __future__ import annotations

import torch

from elastic.torch import _backend, plane
from elastic.torch._staging import (
    default_staging,
    from_transfer,
    reduce_dtype,
    transfer_view,
)
from elastic.torch.plane import group_ops


def _host(tensor: torch.Tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    return default_staging().to_host(tensor)


def _device_type(tensor: torch.Tensor | None) -> str:
    return tensor.device.type if isinstance(tensor, torch.Tensor) else "cpu"


def _reducible(host: torch.Tensor) -> torch.Tensor:
    want = reduce_dtype(host.dtype)
    return host if host.dtype == want else host.to(want)


def allreduce(tensor: torch.Tensor, op: str = "average") -> torch.Tensor:
    """A new tensor (``tensor``'s dtype and device): ``tensor`` reduced over all workers
    with ``op`` ("average", "sum", "max", "min")."""
    group = plane.group_for(_device_type(tensor))
    if group is not None:
        return group_ops.allreduce(group, tensor, op)
    host = _reducible(_host(tensor))
    result = torch.from_numpy(_backend.allreduce_array(host.numpy(), op))
    if result.dtype != tensor.dtype:
        result = result.to(tensor.dtype)
    return default_staging().to_device(result, tensor)


def allreduce_(tensor: torch.Tensor, op: str = "average") -> torch.Tensor:
    """``tensor`` reduced over all workers, in place; returns ``tensor``."""
    staging = default_staging()
    if plane.plane(_device_type(tensor)) == plane.RING and (
        not staging.needs_staging(tensor)
        and tensor.is_contiguous()
        and reduce_dtype(tensor.dtype) == tensor.dtype
    ):
        _backend.allreduce_into(tensor.detach().numpy(), op)
        return tensor
    with torch.no_grad():
        return tensor.copy_(allreduce(tensor, op))


def _received(arr, like: torch.Tensor | None) -> torch.Tensor:
    """The broadcast/allgather result as a tensor; bit patterns of dtypes numpy lacks
    are viewed back as ``like``'s dtype."""
    if like is not None and transfer_view(torch.empty(0, dtype=like.dtype)).dtype == arr.dtype:
        return from_transfer(arr, like.dtype)
    return torch.from_numpy(arr)


def broadcast(tensor: torch.Tensor | None, root: int = 0) -> torch.Tensor:
    """A new tensor holding ``root``'s ``tensor`` (its shape and dtype) on every rank,
    on this rank's ``tensor``'s device (CPU when ``tensor`` is None off the root; on the
    NCCL plane the root's tensor decides the plane, so pass one everywhere)."""
    if _backend.world_rank() == root and tensor is None:
        raise ValueError(f"broadcast: the root (rank {root}) must pass a tensor")
    group = plane.group_for(_device_type(tensor))
    if group is not None:
        return group_ops.broadcast(group, tensor, root)
    mine = None
    if tensor is not None and _backend.world_rank() == root:
        mine = transfer_view(_host(tensor))
    result = _received(_backend.broadcast_array(mine, root), tensor)
    return result if tensor is None else default_staging().to_device(result, tensor)


def broadcast_(tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
    """``root``'s values written into every rank's ``tensor``; returns ``tensor``.

    Raises ValueError when root's tensor has another shape or dtype."""
    on_ring = plane.plane(_device_type(tensor)) == plane.RING
    if on_ring and not default_staging().needs_staging(tensor) and tensor.is_contiguous():
        _backend.broadcast_into(transfer_view(tensor), root)
        return tensor
    result = broadcast(tensor, root)
    if result.shape != tensor.shape or result.dtype != tensor.dtype:
        raise ValueError(
            f"broadcast from rank {root}: it sent {result.dtype}"
            f"{tuple(result.shape)}, this rank has {tensor.dtype}"
            f"{tuple(tensor.shape)}"
        )
    with torch.no_grad():
        return tensor.copy_(result)


def allgather(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated on dimension 0 in rank order (first
    dimensions may differ; a 0-d tensor counts as one row)."""
    group = plane.group_for(_device_type(tensor))
    if group is not None:
        return group_ops.allgather(group, tensor)
    gathered = _backend.allgather_array(transfer_view(_host(tensor)))
    return default_staging().to_device(_received(gathered, tensor), tensor)


def broadcast_object(obj=None, root: int = 0):
    """``root``'s picklable ``obj`` on every rank."""
    return _backend.broadcast_object(obj, root)


def allgather_object(obj) -> list:
    """Every rank's picklable ``obj``, in rank order."""
    return _backend.allgather_object(obj)
