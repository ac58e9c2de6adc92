"""The test hosts a benchmark runs on (network and PID namespaces, ``benchmarks.harness.netns``):
what it needs to make them, and reaping what ran there."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys

from benchmarks.harness.etcd_cluster import ETCD
from benchmarks.harness.netns import NetnsHost
from benchmarks.harness.waits import BenchTimeout, wait_for

#: torchrun's c10d rendezvous port on a test host's own network namespace (nothing else
#: there uses it)
RDZV_PORT = 29400


def reap(*hosts: NetnsHost) -> None:
    """SIGKILL every process of ``hosts`` but their init and sshd: on hosts this benchmark
    made, those are the job's (agents, workers, their ssh sessions)."""
    for host in hosts:
        for pid in host.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(BenchTimeout):
        wait_for(lambda: not any(h.pids() for h in hosts), 10.0, "the hosts' processes to end")


def require_root(prog: str) -> None:
    """Exit with a one-line error unless this process is root (the test hosts need it)."""
    if os.geteuid() != 0:
        sys.exit(
            f"{prog}: needs root: the test hosts are network and PID namespaces "
            f"(run: sudo {sys.executable} {' '.join(sys.argv)})"
        )


def require_tools(configs: list[str], prog: str) -> None:
    """Exit with a one-line error when a configuration's peer is missing: the ``etcd``
    binary for ``etcd``, torch for ``torchrun``."""
    if "etcd" in configs and not os.access(ETCD, os.X_OK):
        sys.exit(f"{prog}: {ETCD} not found: install etcd, or leave out --configs etcd")
    if "torchrun" in configs and importlib.util.find_spec("torch") is None:
        sys.exit(
            f"{prog}: torch is not installed for {sys.executable}: install it "
            "(pip install torch), or leave out --configs torchrun"
        )
