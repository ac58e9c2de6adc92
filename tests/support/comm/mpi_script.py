"""Run under ``mpiexec -n N python -m tests.support.comm.mpi_script``: the collective battery on
MpiCommunicator. Rank 0 prints ``MPI_OK <checks>`` on success; any failure exits non-zero."""

from __future__ import annotations

import os
import sys

import numpy as np

from elastic.comm import CommunicatorClosedError, MpiCommunicator, detect_mpi
from tests.support.comm.battery import run_battery


def main() -> int:
    assert detect_mpi(os.environ), "mpiexec did not set the variables detect_mpi expects"
    comm = MpiCommunicator()
    assert comm.transport == "mpi" and comm.size >= 1
    checks = run_battery(comm, seed=comm.size)
    comm.close("done")
    try:
        comm.allreduce(np.ones(2))
    except CommunicatorClosedError:
        checks += 1
    else:
        raise AssertionError("a closed MpiCommunicator accepted a call")
    if comm.rank == 0:
        print(f"MPI_OK {checks}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    except Exception:  # noqa: BLE001  (any failure: report it and end every rank)
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)  # do not leave the other ranks blocked in a collective
    sys.exit(rc)
