"""Which data plane carries a tensor (pure: every input is an argument).

The setting (``elastic.init(torch_backend=...)`` or ``ELASTIC_TORCH_BACKEND``) names one
of ``elastic.context.TORCH_BACKENDS``:

- "auto" (the default): CUDA tensors on NCCL when torch has it, every other tensor on
  the ring (CUDA tensors staged through pinned host memory when NCCL is missing);
- "ring": every tensor on the ring, as before the planes existed;
- "gloo": every tensor on a gloo process group (the NCCL plane's mechanics on CPU);
- "nccl": CUDA tensors on NCCL, CPU tensors on the ring (NCCL carries no host memory).

A process group is a round's, and only a job run by elastic-run has rounds and a store
to meet in: under mpiexec "auto" keeps the ring (MPI), and "gloo" or "nccl" is refused.
A round of one member has nothing to exchange: it keeps the ring, which copies locally.
"""

from __future__ import annotations

from elastic.errors import ElasticError

RING = "ring"
GLOO = "gloo"
NCCL = "nccl"


class BackendUnavailableError(ElasticError, ValueError):
    """The torch backend asked for cannot run here (NCCL without CUDA or without torch's
    NCCL build, a process group under mpiexec)."""


def plane_for(
    setting: str, device_type: str, *, size: int, world: str | None, nccl_available: bool
) -> str:
    """The plane ("ring", "gloo" or "nccl") of a tensor on ``device_type`` ("cpu",
    "cuda", ...), in a round of ``size`` members of a world of kind ``world``
    ("elastic", "mpi", "alone"; ``elastic.context.world_kind``).

    Raises:
        BackendUnavailableError: ``setting`` asks for NCCL and NCCL is not available,
            or for a process group under mpiexec.
        ValueError: ``setting`` is no backend name.
    """
    if setting not in ("auto", RING, GLOO, NCCL):
        raise ValueError(f"unknown torch backend {setting!r}")
    if setting == NCCL and not nccl_available:
        raise BackendUnavailableError(
            "torch backend 'nccl' asked for, but this torch has no NCCL or sees no GPU; "
            "use 'auto' (NCCL where it exists) or 'gloo'"
        )
    if setting in (GLOO, NCCL) and world == "mpi":
        raise BackendUnavailableError(
            f"torch backend {setting!r} needs elastic-run (its rounds and store); under "
            "mpiexec the tensors go through MPI: unset ELASTIC_TORCH_BACKEND"
        )
    if size <= 1 or world == "mpi":
        return RING
    if setting == GLOO:
        return GLOO
    on_gpu = device_type == "cuda"
    if setting == NCCL:
        return NCCL if on_gpu else RING
    if setting == "auto" and on_gpu and nccl_available:
        return NCCL
    return RING
