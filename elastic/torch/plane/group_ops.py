"""The user-facing tensor collectives on a round's group (``elastic.torch.collectives``
calls these when a tensor's plane is a process group): new result tensors, shapes
agreed first where the receivers cannot know them.

Every collective runs on a fresh tensor on the group's device (``RoundGroup``'s rule:
an aborted collective must not write into anything that outlives the round), and the
result comes back on the caller's tensor's device.
"""

from __future__ import annotations

import zlib

import torch

from elastic.errors import CollectiveMismatchError
from elastic.torch import _backend
from elastic.torch.plane.group import RoundGroup


def _on_group(group: RoundGroup, tensor: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous copy of ``tensor`` on the group's device."""
    return tensor.detach().to(group.backend.device(), copy=True).contiguous()


def allreduce(group: RoundGroup, tensor: torch.Tensor, op: str) -> torch.Tensor:
    """A new tensor: ``tensor`` reduced with ``op`` over the group.

    Raises ValueError for an unknown op, WorkerLostError when the round ends first."""
    if op not in ("sum", "average", "max", "min"):
        raise ValueError(f"op must be sum, average, max or min, not {op!r}")
    work = _on_group(group, tensor)
    group.start_allreduce(work, op).wait()
    return work.to(tensor.device)


def broadcast(group: RoundGroup, tensor: torch.Tensor | None, root: int) -> torch.Tensor:
    """``root``'s ``tensor`` on every member (its shape and dtype; the shape travels
    first, on the ring), on this member's ``tensor``'s device.

    Raises ValueError for a root out of range, WorkerLostError when the round ends."""
    if not 0 <= root < group.size:
        raise ValueError(f"root {root} out of range for {group.size} ranks")
    mine = group.rank == root
    shape, dtype = _backend.broadcast_object(
        (tuple(tensor.shape), tensor.dtype) if mine and tensor is not None else None, root
    )
    device = group.backend.device()
    work = _on_group(group, tensor) if mine and tensor is not None else None
    if work is None:
        work = torch.empty(shape, dtype=dtype, device=device)
    group.start_broadcast(work, root).wait()
    return work if tensor is None else work.to(tensor.device)


def row_signature(tensor: torch.Tensor) -> int:
    """What must agree between members for an allgather: dtype and the shape past the
    first dimension (pure)."""
    return zlib.crc32(repr((str(tensor.dtype), tuple(tensor.shape[1:]))).encode())


def allgather(group: RoundGroup, tensor: torch.Tensor) -> torch.Tensor:
    """Every member's ``tensor`` concatenated on dimension 0 in rank order (first
    dimensions may differ; 0-d counts as one row).

    Raises CollectiveMismatchError (on every member) when dtypes or trailing shapes
    differ, WorkerLostError when the round ends."""
    rows = _on_group(group, tensor.reshape(1) if tensor.dim() == 0 else tensor)
    device = rows.device
    header = torch.tensor([rows.shape[0], row_signature(rows)], dtype=torch.int64, device=device)
    headers = torch.empty(2 * group.size, dtype=torch.int64, device=device)
    group.start_allgather(headers, header).wait()
    counts, signatures = headers.view(group.size, 2).cpu().unbind(1)
    if len(set(signatures.tolist())) > 1:
        raise CollectiveMismatchError(
            f"allgather: members sent tensors of other dtypes or row shapes "
            f"(this rank: {rows.dtype} rows of {tuple(rows.shape[1:])})"
        )
    longest = int(counts.max())
    padded = torch.zeros((longest, *rows.shape[1:]), dtype=rows.dtype, device=device)
    padded[: rows.shape[0]] = rows
    gathered = torch.empty((group.size * longest, *rows.shape[1:]), dtype=rows.dtype, device=device)
    group.start_allgather(gathered, padded).wait()
    parts = [gathered[r * longest : r * longest + int(n)] for r, n in enumerate(counts.tolist())]
    return torch.cat(parts).to(tensor.device)
