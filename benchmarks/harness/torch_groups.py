"""Groups of torch training workers (``workloads/torch_train.py``), ours under elastic-run
or DDP, commanded over the control channel: what the CPU and the GPU torch benchmarks
share."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from benchmarks.harness.control import ControlServer
from benchmarks.harness.paths import ROOT, WORKLOADS
from benchmarks.harness.processes import free_port

WORKER = WORKLOADS / "torch_train.py"


class Group:
    """One implementation's workers, connected back to us for commands."""

    def __init__(
        self,
        impl: str,
        model: str,
        world: int,
        batch: int,
        extra: list[str] | None = None,
        more_env: dict[str, str] | None = None,
    ):
        """``extra``: more arguments of each worker (``--device cuda`` ...); ``more_env``:
        more environment (``ELASTIC_TORCH_BACKEND`` ...)."""
        self.procs: list[subprocess.Popen] = []
        srv = ControlServer("127.0.0.1", world, accept_timeout=300)
        control = srv.address
        worker = [
            sys.executable,
            str(WORKER),
            "--impl",
            impl,
            "--control",
            control,
            "--model",
            model,
            "--batch",
            str(batch),
            *(extra or []),
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT), **(more_env or {}))
        try:
            if impl == "ours":
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "driver.cli", "-np", str(world), *worker],
                        cwd=ROOT,
                        env=env,
                        start_new_session=True,
                    )
                )
            else:
                port = free_port()
                for rank in range(world):
                    self.procs.append(
                        subprocess.Popen(
                            [
                                *worker,
                                "--rank",
                                str(rank),
                                "--world",
                                str(world),
                                "--port",
                                str(port),
                            ],
                            cwd=ROOT,
                            env=env,
                            start_new_session=True,
                        )
                    )
            self.lines = srv.accept_ranks()
        except BaseException:
            self.close()
            raise
        finally:
            srv.close()

    def run(self, steps: int) -> tuple[float, list[float]]:
        """Seconds of ``steps`` steps (slowest rank) and rank 0's hidden shares."""
        for ln in self.lines:
            ln.send({"cmd": "run", "steps": steps})
        answers = [ln.recv() for ln in self.lines]
        return max(a["seconds"] for a in answers), answers[0]["hidden"]

    def close(self) -> None:
        for ln in getattr(self, "lines", []):
            with contextlib.suppress(OSError):
                ln.send({"cmd": "exit"})
        deadline = time.monotonic() + 30
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()


def parameters_m(model: str) -> float:
    """Millions of parameters in ``model``."""
    from benchmarks.workloads.torch_train import build_model  # torch loads only when asked

    return round(sum(p.numel() for p in build_model(model)[0].parameters()) / 1e6, 2)
