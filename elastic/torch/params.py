"""Bringing every rank to root's model and optimizer: ``broadcast_parameters`` and
``broadcast_optimizer_state``. Both write into the caller's own tensors and optimizer
(in place), so every reference the training loop holds sees the new values.

Tensors travel fused: one broadcast per dtype, device type and ``FUSE_BYTES`` of
data, not one per tensor, each on its plane (``elastic.torch.plane``): CUDA tensors on
the round's NCCL group by default, the others on the ring.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from elastic.torch import _backend, plane
from elastic.torch._staging import from_transfer, transfer_view
from elastic.torch.plane import RoundGroup

#: most bytes fused into one broadcast
FUSE_BYTES = 64 << 20


def _fused_groups(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Indices of ``tensors`` grouped by dtype and device type (in first-seen order),
    each group cut at ``FUSE_BYTES`` (pure: the same on every rank that holds the same
    layout)."""
    by_kind: dict[tuple[torch.dtype, str], list[list[int]]] = {}
    sizes: dict[tuple[torch.dtype, str], int] = {}
    for i, t in enumerate(tensors):
        kind = (t.dtype, t.device.type)
        groups = by_kind.setdefault(kind, [[]])
        nbytes = t.numel() * t.element_size()
        if groups[-1] and sizes[kind] + nbytes > FUSE_BYTES:
            groups.append([])
            sizes[kind] = 0
        groups[-1].append(i)
        sizes[kind] = sizes.get(kind, 0) + nbytes
    return [g for groups in by_kind.values() for g in groups]


def _broadcast_on_group(group: RoundGroup, chunk: list[torch.Tensor], root: int) -> None:
    """``root``'s ``chunk`` (one dtype) into every member's, as one fused broadcast on a
    fresh buffer of the group's device."""
    device = group.backend.device()
    if group.rank == root:
        flat = torch.cat([t.detach().reshape(-1).to(device) for t in chunk])
    else:
        flat = torch.empty(sum(t.numel() for t in chunk), dtype=chunk[0].dtype, device=device)
    group.start_broadcast(flat, root).wait()
    if group.rank == root:
        return
    offset = 0
    with torch.no_grad():
        for t in chunk:
            t.copy_(flat[offset : offset + t.numel()].view(t.shape))
            offset += t.numel()


def broadcast_tensors(tensors: list[torch.Tensor], root: int) -> None:
    """Write ``root``'s values into every rank's ``tensors`` (same shapes, dtypes and
    device types on every rank, in the same order), fused. Raises like
    ``elastic.broadcast``."""
    is_root = _backend.world_rank() == root
    for group in _fused_groups(tensors):
        chunk = [tensors[i] for i in group]
        on_group = plane.group_for(chunk[0].device.type)
        if on_group is not None:
            _broadcast_on_group(on_group, chunk, root)
            continue
        dtype = chunk[0].dtype
        flat = None
        if is_root:
            flat = transfer_view(torch.cat([t.detach().reshape(-1).cpu() for t in chunk]))
        received = from_transfer(_backend.broadcast_array(flat, root), dtype)
        if is_root:
            continue
        total = sum(t.numel() for t in chunk)
        if received.numel() != total:
            raise ValueError(
                f"broadcast from rank {root}: {received.numel()} {dtype} "
                f"values for tensors holding {total} here"
            )
        offset = 0
        with torch.no_grad():
            for t in chunk:
                n = t.numel()
                t.copy_(received[offset : offset + n].view(t.shape))
                offset += n


def _named(params) -> list[tuple[str, torch.Tensor]]:
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    named = []
    for i, item in enumerate(items):
        name, t = item if isinstance(item, tuple) else (str(i), item)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(t).__name__}, not a tensor")
        named.append((name, t))
    return named


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable, root_rank: int = 0) -> None:
    """Write ``root_rank``'s values into every rank's ``params`` in place:
    ``model.state_dict()`` (parameters and buffers), ``model.named_parameters()``, or a
    list of tensors.

    Raises ValueError, on every rank alike, when the ranks' names, shapes or dtypes
    differ (a different model), before any tensor is sent; WorkerLostError when a peer
    is lost."""
    named = _named(params)
    layout = [(name, tuple(t.shape), str(t.dtype)) for name, t in named]
    layouts = _backend.allgather_object(layout)
    for rank, theirs in enumerate(layouts):
        if theirs != layouts[root_rank]:
            diff = next(
                (f"{a} vs {b}" for a, b in zip(layouts[root_rank], theirs) if a != b),
                f"{len(layouts[root_rank])} vs {len(theirs)} tensors",
            )
            raise ValueError(
                f"broadcast_parameters: rank {rank} holds other tensors than "
                f"rank {root_rank} ({diff})"
            )
    broadcast_tensors([t for _, t in named], root_rank)


class _Slot:
    """Where a tensor was in a state dict sent as an object (its data travels fused);
    ``device``: its device type, so every rank receives it on the same plane."""

    def __init__(self, index: int, shape: tuple[int, ...], dtype: torch.dtype, device: str):
        self.index, self.shape, self.dtype, self.device = index, shape, dtype, device


def _split(value: Any, tensors: list[torch.Tensor]) -> Any:
    """``value`` with every tensor replaced by a ``_Slot`` (tensors appended in order)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Slot(len(tensors) - 1, tuple(value.shape), value.dtype, value.device.type)
    if isinstance(value, dict):
        return {k: _split(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_split(v, tensors) for v in value)
    return value


def _fill(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, _Slot):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, tensors) for v in value)
    return value


def _slots(value: Any) -> list[_Slot]:
    if isinstance(value, _Slot):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _slots(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _slots(v)]
    return []


def _local(device_type: str) -> torch.device:
    """This process's device of ``device_type`` (its current CUDA device for "cuda")."""
    if device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device_type)


def broadcast_state_dict(state_dict: dict | None, root: int) -> dict:
    """``root``'s ``state_dict`` (nested dicts and lists of tensors and picklable
    values) on every rank, its tensors sent fused rather than pickled. Off the root the
    tensors are new tensors of the root's device types (on this process's device);
    ``state_dict`` is only read on the root."""
    tensors: list[torch.Tensor] = []
    skeleton = _split(state_dict, tensors) if _backend.world_rank() == root else None
    skeleton = _backend.broadcast_object(skeleton, root)
    if _backend.world_rank() != root:
        slots = sorted(_slots(skeleton), key=lambda s: s.index)
        tensors = [torch.empty(s.shape, dtype=s.dtype, device=_local(s.device)) for s in slots]
    broadcast_tensors(tensors, root)
    return _fill(skeleton, tensors)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Load ``root_rank``'s optimizer state (slots such as momentum or Adam's moments,
    step counts, hyper-parameters of every param group) into every rank's
    ``optimizer``, in place. A fresh optimizer with no state yet is fine.

    Raises ValueError when the ranks' optimizers have other parameter layouts (from
    ``load_state_dict``), WorkerLostError when a peer is lost."""
    state = optimizer.state_dict() if _backend.world_rank() == root_rank else None
    received = broadcast_state_dict(state, root_rank)
    if _backend.world_rank() != root_rank:
        optimizer.load_state_dict(received)
