"""Groups of allreduce workers (``benchmarks/allreduce_bench.py --worker``), one group per
implementation, all alive at once and measured in interleaved turns: what the one-host
and the two-host allreduce benchmarks share."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable

from benchmarks.harness.control import ControlServer, Line
from benchmarks.harness.paths import ROOT

#: the script whose ``--worker`` mode is one rank of a group
ALLREDUCE_WORKER = ROOT / "benchmarks" / "allreduce_bench.py"


Spawn = Callable[[list[str], int], subprocess.Popen]
"""``spawn(argv, rank)``: start rank ``rank``'s worker (``argv`` without ``--bind``)."""


def spawn_here(argv: list[str], rank: int) -> subprocess.Popen:
    return subprocess.Popen(argv, env=dict(os.environ, PYTHONPATH=str(ROOT)))


class Group:
    """One implementation's worker processes and their control connections, started by
    ``spawn`` (here by default); they reach this process at ``control_host``."""

    def __init__(
        self,
        impl: str,
        world: int,
        secret: str,
        ours_settings: str = "{}",
        *,
        spawn: Spawn = spawn_here,
        control_host: str = "127.0.0.1",
    ):
        self.impl = impl
        self.world = world
        self.procs: list[subprocess.Popen] = []
        self.lines: list[Line] = []
        srv = ControlServer(control_host, world, accept_timeout=120)
        control = srv.address
        me = [
            sys.executable,
            str(ALLREDUCE_WORKER),
            "--worker",
            impl,
            "--control",
            control,
            "--secret",
            secret,
            "--ours-settings",
            ours_settings,
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        try:
            if impl == "mpi":
                self.procs.append(
                    subprocess.Popen(
                        [shutil.which("mpiexec") or "mpiexec", "-n", str(world), *me], env=env
                    )
                )
            else:
                for r in range(world):
                    self.procs.append(spawn(me + ["--rank", str(r), "--world", str(world)], r))
            self.lines = srv.accept_ranks()
        finally:
            srv.close()
        if impl in ("ours", "ours_tcp", "raw_tcp"):
            addresses = [ln.recv()["address"] for ln in self.lines]
            for ln in self.lines:
                ln.send({"addresses": addresses})
        elif impl == "gloo":
            masters = [ln.recv()["master"] for ln in self.lines]  # every rank answers
            for ln in self.lines:
                ln.send({"master": masters[0]})
        transports = [ln.recv()["transport"] for ln in self.lines]  # every rank answers
        self.transport = transports[0]

    def run(self, mib: int, iters: int, warmup: int) -> list[float]:
        """Per timed call, the slowest rank's seconds."""
        for ln in self.lines:
            ln.send({"cmd": "run", "mib": mib, "iters": iters, "warmup": warmup})
        per_rank = [ln.recv()["times"] for ln in self.lines]
        return [max(ts) for ts in zip(*per_rank)]

    def close(self) -> None:
        for ln in self.lines:
            with contextlib.suppress(OSError, AttributeError):
                ln.send({"cmd": "exit"})
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def available(impl: str) -> str | None:
    """None when ``impl`` can run here, else why not."""
    try:
        if impl == "gloo":
            import importlib.util

            if importlib.util.find_spec("torch") is None:
                return "torch is not installed (./scripts/install bench)"
        if impl == "mpi":
            import importlib.util

            if importlib.util.find_spec("mpi4py") is None or not shutil.which("mpiexec"):
                return "mpi4py/mpiexec missing (./scripts/install mpi)"
    except Exception as e:  # noqa: BLE001 - report and skip
        return str(e)
    return None


def measure(
    groups: dict[str, Group], mib: int, blocks: int, iters: int, warmup: int
) -> dict[str, list[float]]:
    """Every group's timed calls of ``mib`` MiB (the slowest rank's seconds each), taken in
    ``blocks`` interleaved turns of ``iters`` calls (``warmup`` more in the first)."""
    impls = list(groups)
    samples: dict[str, list[float]] = {impl: [] for impl in impls}
    for block in range(blocks):
        # Rotate the order so no implementation always runs right after the same
        # neighbour (cache and scheduler state).
        order = impls[block % len(impls) :] + impls[: block % len(impls)]
        for impl in order:
            samples[impl] += groups[impl].run(mib, iters, warmup if block == 0 else 0)
    return samples


def summarize(
    bench: str,
    where: dict,
    groups: dict[str, Group],
    samples: dict[str, list[float]],
    mib: int,
    world: int,
    args,
) -> dict:
    """One configuration's JSON row: ``where`` it ran, median times, the bus bandwidth of
    every collective (``raw_tcp`` is none), and ours against gloo and MPI."""
    nbytes = mib * (1 << 20)
    med = {impl: statistics.median(ts) for impl, ts in samples.items()}
    busbw = {
        impl: 2 * (world - 1) / world * nbytes / t / 1e9
        for impl, t in med.items()
        if impl != "raw_tcp"
    }
    row: dict = {
        "bench": bench,
        **where,
        "size_mib": mib,
        "dtype": "float32",
        "timed_calls": args.blocks * args.iters,
        "median_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        "busbw_GBps": {k: round(v, 3) for k, v in busbw.items()},
    }
    if "gloo" in busbw:
        for impl in ("ours", "ours_tcp"):
            if impl in busbw:
                row[f"ratio_{impl}_gloo"] = round(busbw[impl] / busbw["gloo"], 3)
    if "mpi" in busbw and "ours" in busbw:
        row["ratio_ours_mpi"] = round(busbw["ours"] / busbw["mpi"], 3)
    if "ours" in groups:
        row["ours_transport"] = groups["ours"].transport
    return row
