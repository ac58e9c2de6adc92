"""The data planes of ``elastic.torch``: which one carries a tensor, and the process
group plane (gloo, NCCL) beside the ring.

- ``choice``: the plane of a tensor, from the setting and its device (pure);
- ``store``: torch's ``Store`` over the job's store, under a round's prefix;
- ``backends``: gloo and NCCL by name: build, wait, abort;
- ``group``: one round's group, aborted when the round's ring closes;
- ``rounds``: the current round's group, built at first use, retired with the round.

``group_for(device_type)`` is what the collectives ask: the round's group for tensors on
that device, or None for the ring.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from elastic import context
from elastic.torch import _backend
from elastic.torch.plane.choice import RING, BackendUnavailableError, plane_for
from elastic.torch.plane.group import PendingCollective, RoundGroup
from elastic.torch.plane.rounds import RoundGroups

__all__ = [
    "RING",
    "BackendUnavailableError",
    "PendingCollective",
    "RoundGroup",
    "group_for",
    "plane",
]

_groups = RoundGroups()


@functools.cache
def nccl_available() -> bool:
    """Whether this process can run NCCL: torch built with it, and a GPU."""
    return dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available()


def plane(device_type: str) -> str:
    """The plane ("ring", "gloo", "nccl") of tensors on ``device_type`` in this round.

    Raises BackendUnavailableError (the setting cannot run here), ValueError (a bad
    ``ELASTIC_TORCH_BACKEND``), WorkerLostError (the round is re-forming)."""
    return plane_for(
        context.torch_backend(),
        device_type,
        size=_backend.world_size(),
        world=context.world_kind(),
        nccl_available=nccl_available(),
    )


def group_for(device_type: str) -> RoundGroup | None:
    """The current round's process group for tensors on ``device_type``, or None when
    they go through the ring. Raises like ``plane`` and ``RoundGroups.group``."""
    name = plane(device_type)
    return None if name == RING else _groups.group(name)
