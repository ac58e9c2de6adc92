"""``MpiCommunicator``: the same collectives on mpi4py's buffer API, for jobs started by
``mpiexec`` (a fixed world: no elasticity, no failure recovery).

mpi4py is imported only when an ``MpiCommunicator`` is built, so the package works
without the ``mpi`` extra.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from elastic.comm import layout
from elastic.comm.base import Communicator
from elastic.comm.outbuf import OutputCache
from elastic.errors import CollectiveMismatchError, CommunicatorClosedError

# Variables set by the common launchers for each process they start (MPICH/Hydra and
# Intel MPI: PMI_*; Open MPI: OMPI_COMM_WORLD_*; PMIx-based launchers: PMIX_RANK).
_MPI_ENV_VARS = (
    "PMI_RANK",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "MPI_LOCALRANKID",
    "PMIX_RANK",
)


def detect_mpi(environ: Mapping[str, str]) -> bool:
    """True when ``environ`` shows this process was started by an MPI launcher."""
    return any(environ.get(name) not in (None, "") for name in _MPI_ENV_VARS)


class MpiCommunicator(Communicator):
    """Collectives over ``comm`` (default: a duplicate of ``MPI.COMM_WORLD``, so this
    library's messages never mix with the user's own MPI traffic).

    ``close()`` marks the communicator closed: later calls raise
    CommunicatorClosedError. A call already blocked inside MPI cannot be interrupted
    (MPI has no cancellation for collectives); in a fixed MPI world there is no new
    round to interrupt it for. Raises ImportError when mpi4py is missing.
    """

    def __init__(self, comm: Any | None = None):
        from mpi4py import MPI  # lazy: the mpi extra is optional

        self._MPI = MPI
        self._comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        self._rank = self._comm.Get_rank()
        self._size = self._comm.Get_size()
        self._closed: str | None = None
        self._busy = 0
        self._outputs = OutputCache()
        self._lock = threading.Lock()
        self._ops = {"sum": MPI.SUM, "average": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}

    @property
    def transport(self) -> str:
        return "mpi"

    @property
    def closed(self) -> bool:
        return self._closed is not None

    @contextlib.contextmanager
    def _op(self):
        """Hold the MPI communicator for one call; ``close`` frees it only when no call
        is inside MPI (freeing a communicator under a running collective is undefined)."""
        with self._lock:
            if self._closed is not None:
                raise CommunicatorClosedError(self._closed)
            self._busy += 1
        try:
            yield self._comm
        finally:
            with self._lock:
                self._busy -= 1
                free = self._closed is not None and self._busy == 0
            if free:
                self._free()

    def _free(self) -> None:
        with self._lock:
            comm, self._comm = self._comm, None
        if comm is not None:
            # Best effort: freeing during MPI finalisation may fail with any MPI error.
            with contextlib.suppress(Exception):
                comm.Free()

    def _allreduce(self, arr: np.ndarray, op: str) -> np.ndarray:
        out = self._outputs.empty(arr.shape, arr.dtype)
        with self._op() as comm:
            comm.Allreduce(arr, out, op=self._ops[op])
        if op == "average":
            layout.finish_average(out.reshape(-1), self._size)
        return out

    def _broadcast(self, arr: np.ndarray | None, root: int) -> np.ndarray:
        meta = None if arr is None else (arr.dtype.str, arr.shape)
        with self._op() as comm:
            dstr, shape = comm.bcast(meta, root=root)
            out = arr.copy() if arr is not None else np.empty(shape, dtype=np.dtype(dstr))
            # Bytes, so any fixed-size dtype travels without an MPI datatype of its own.
            comm.Bcast(out.reshape(-1).view(np.uint8), root=root)
        return out

    def _allgather_rows(self, arr: np.ndarray) -> tuple[np.ndarray, list[int]]:
        with self._op() as comm:
            return self._allgather_on(comm, arr)

    def _allgather_on(self, comm, arr: np.ndarray) -> tuple[np.ndarray, list[int]]:
        metas = comm.allgather((arr.dtype.str, arr.shape))
        dstr0, shape0 = metas[0]
        for j, (dstr, shape) in enumerate(metas):
            if dstr != dstr0 or tuple(shape[1:]) != tuple(shape0[1:]):
                raise CollectiveMismatchError(
                    f"allgather: rank 0 has {dstr0}{tuple(shape0)}, rank {j} has "
                    f"{dstr}{tuple(shape)}"
                )
        dtype = np.dtype(dstr0)
        rows = [shape[0] for _, shape in metas]
        row_bytes = int(np.prod(shape0[1:], dtype=np.int64)) * dtype.itemsize
        counts = [k * row_bytes for k in rows]
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist()
        out = np.empty((sum(rows),) + tuple(shape0[1:]), dtype=dtype)
        comm.Allgatherv(
            arr.reshape(-1).view(np.uint8),
            [out.reshape(-1).view(np.uint8), counts, displs, self._MPI.BYTE],
        )
        return out, rows

    def barrier(self) -> None:
        """See ``Communicator.barrier``."""
        with self._op() as comm:
            comm.Barrier()

    def close(self, reason: str = "") -> None:
        """See the class docstring: later calls raise CommunicatorClosedError."""
        with self._lock:
            if self._closed is not None:
                return
            self._closed = "communicator closed" + (f": {reason}" if reason else "")
            idle = self._busy == 0
        if idle:
            self._free()
