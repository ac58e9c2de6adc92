"""The processes a benchmark starts: their environment, ports, and signals."""

from __future__ import annotations

import os
import signal
import socket

#: the same thread settings for both systems (torchrun sets OMP_NUM_THREADS=1 itself
#: for several workers per node); more BLAS threads than cores only adds noise here
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal ``pid``'s process group when it leads one (workers of both systems run in
    their own session), else the process alone; nothing if it is gone."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
