"""``hvd.init()``, the layout (``rank()``, ``size()``, ...) and what the runtime is built
with (``nccl_built()``, ``mpi_enabled()``, ...), answered by our runtime.

The layout is the current round's: after a re-form ``hvd.rank()`` and ``hvd.size()``
say the new world, as Horovod's do after its reset. The build questions get this
runtime's true answers, so a script that branches on them takes the branch that fits:
no NCCL, no Gloo, no DDL or oneCCL (tensors go over our own ring, CUDA tensors through
pinned host memory); MPI is enabled when the process was started by ``mpiexec`` (our
MPI world runs on mpi4py, which is then "built").
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

import elastic
from elastic import context
from elastic.horovod.errors import HorovodUnsupportedError


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job (idempotent): under ``elastic-run`` register and wait for the first
    round with this worker; under ``mpiexec`` the fixed MPI world; alone a world of one.

    Raises:
        HorovodUnsupportedError: ``comm`` or ``process_sets`` is given (the world is
            the job's, whole: no sub-communicator, no process set).
        RendezvousError: as ``elastic.init()`` (the job's store cannot be reached, no
            round forms in time).
    """
    if comm is not None or process_sets is not None:
        raise HorovodUnsupportedError(
            "hvd.init(comm=..., process_sets=...) is not supported by elastic.horovod: "
            "the world is the whole job (call hvd.init())"
        )
    elastic.init()


def shutdown() -> None:
    """Leave the job (idempotent; also done at exit)."""
    elastic.shutdown()


def is_initialized() -> bool:
    """Whether ``init()`` has been called (and not ``shutdown()``)."""
    return context.world_kind() is not None


def rank() -> int:
    """This worker's rank in the current round (0 is the oldest survivor)."""
    return elastic.rank()


def size() -> int:
    """The number of workers in the current round."""
    return elastic.size()


def local_rank() -> int:
    """This worker's rank among the workers on its host."""
    return elastic.local_rank()


def local_size() -> int:
    """The number of workers on this worker's host."""
    return elastic.local_size()


def cross_rank() -> int:
    """This worker's rank among the workers with its local rank (one per host)."""
    return elastic.cross_rank()


def cross_size() -> int:
    """The number of workers with this worker's local rank."""
    return elastic.cross_size()


def mpi_built(verbose: bool = False) -> bool:
    """Whether MPI can run this runtime: mpi4py is installed (``mpiexec`` worlds)."""
    return importlib.util.find_spec("mpi4py") is not None


def mpi_enabled() -> bool:
    """Whether this process's world is MPI's (started by ``mpiexec``)."""
    return context.world_kind() == "mpi"


def mpi_threads_supported() -> bool:
    """Whether the script may call mpi4py beside the collectives, from any thread: only
    in an MPI world whose MPI gives ``MPI_THREAD_MULTIPLE``. False under ``elastic-run``
    and alone, where there is no MPI communicator to share."""
    if not mpi_enabled():
        return False
    from mpi4py import MPI  # present: the MPI world runs on it

    return bool(MPI.Query_thread() == MPI.THREAD_MULTIPLE)


def gloo_built(verbose: bool = False) -> bool:
    """False: the collectives are our own ring, not Gloo."""
    return False


def gloo_enabled() -> bool:
    """False: the collectives are our own ring, not Gloo."""
    return False


def nccl_built(verbose: bool = False) -> bool:
    """False: CUDA tensors are reduced through pinned host memory, not NCCL."""
    return False


def ddl_built(verbose: bool = False) -> bool:
    """False: no IBM DDL."""
    return False


def ccl_built(verbose: bool = False) -> bool:
    """False: no oneCCL."""
    return False


def cuda_built(verbose: bool = False) -> bool:
    """Whether CUDA tensors can be passed to the collectives (torch is built with CUDA;
    they travel through pinned host memory)."""
    return bool(torch.backends.cuda.is_built())


def rocm_built(verbose: bool = False) -> bool:
    """Whether ROCm tensors can be passed to the collectives (torch is built with ROCm;
    they travel through host memory as CUDA tensors do)."""
    return getattr(torch.version, "hip", None) is not None


__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "gloo_built",
    "gloo_enabled",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
]
