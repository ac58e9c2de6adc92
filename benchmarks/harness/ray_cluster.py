"""A real Ray cluster on the test hosts (``RayCluster``): ``ray start --head`` in one
host and ``ray start --address`` in others, each ``--block`` in the foreground of its
own session, so teardown is by pid (and each test host's PID 1 ends the rest). The
recipe and its traps are in ``../shared/SLURM-ON-TEST-HOSTS.md``: one ``--temp-dir`` per
node (a short path: unix socket names), ``--node-ip-address`` the host's own, and on the
head the health checks that find a silently cut node in seconds instead of a minute.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness.jobs import wait_until
from benchmarks.harness.netns import NetnsHost

HEAD_PORT = 6379
READY_TIMEOUT = 90.0
RAY = str(Path(sys.executable).with_name("ray"))
HEALTH_CHECKS = {  # a silent node is dead after ~3 s, not Ray's default 30 s+
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


class RayError(RuntimeError):
    """A Ray node did not start."""


class RayCluster:
    """A head on ``head`` and the nodes ``add`` brings, logs under ``workdir``."""

    def __init__(self, head: NetnsHost, workdir: Path):
        self.head = head
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: socket paths
        self.nodes: dict[str, subprocess.Popen] = {}

    @property
    def address(self) -> str:
        return f"{self.head.address}:{HEAD_PORT}"

    def _start(self, host: NetnsHost, args: list[str]) -> None:
        log = open(self.workdir / f"ray-{host.name}.log", "w")  # noqa: SIM115 (the node's life)
        self.nodes[host.name] = host.popen(
            [
                RAY,
                "start",
                "--block",
                *args,
                f"--node-ip-address={host.address}",
                "--num-cpus=1",
                "--object-store-memory=100000000",
                "--disable-usage-stats",
                f"--temp-dir={self.temp / host.name}",
            ],
            env={**os.environ, **HEALTH_CHECKS, "RAY_USAGE_STATS_ENABLED": "0"},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self) -> RayCluster:
        self._start(self.head, ["--head", f"--port={HEAD_PORT}", "--include-dashboard=false"])
        return self

    def add(self, host: NetnsHost) -> None:
        """Start a node on ``host`` that joins the cluster."""
        self._start(host, [f"--address={self.address}"])

    def alive(self) -> int:
        """How many nodes the head counts alive (asked from inside the head host)."""
        code = (
            "import ray,logging;ray.init(address='auto',logging_level=logging.ERROR);"
            "print(sum(1 for n in ray.nodes() if n['Alive']))"
        )
        done = self.head.run([sys.executable, "-c", code], timeout=30)
        try:
            return int(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    def wait_alive(self, count: int, timeout: float = READY_TIMEOUT) -> None:
        for name, node in self.nodes.items():
            if node.poll() is not None:
                raise RayError(f"the Ray node on {name} exited: {self.log_tail(name)}")
        wait_until(lambda: self.alive() >= count, timeout, f"{count} alive Ray nodes", interval=0.5)

    def log_tail(self, name: str, lines: int = 10) -> str:
        with contextlib.suppress(OSError):
            text = (self.workdir / f"ray-{name}.log").read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""

    def close(self) -> None:
        for node in self.nodes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
        for node in self.nodes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(timeout=10)
        shutil.rmtree(self.temp, ignore_errors=True)

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
