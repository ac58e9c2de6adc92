"""What keeping the state safe costs: snapshots (``elastic-run --checkpoint-dir``) side by
side with a script's own ``torch.save`` and with PyTorch DCP's ``async_save``.

**Overhead.** 2 workers train the 25M-parameter MLP of ``torch_bench.py``
(``workloads/snapshot_train.py``, batch 2 per worker, one thread each) up to
``--steps``; a configuration's overhead is its mean step time (every step, saves
included, after 3 warm-up steps) over the mean step time of its own system's run without
saving in the same round, minus 1. Rounds are interleaved: each runs both baselines first
(their step times turn the 10 s interval into steps for the script-side saves), then
every other configuration in an order that rotates from round to round. That compares
jobs, and this machine's speed drifts by a few percent from one job to the next; so the
same cost is also read inside each job (``in_job``, which drift does not move): every
step's time over the job's median step, summed over the steps of a window after each
save (the save's own step and those its writing overlaps: ``WINDOW_S``), less what the
steps outside every window show; ``save_cost_ms`` is that excess per save in ms, and
``in_job_overhead`` all saves' excess over the job's whole time. Where saves come closer
than a window (every 1 s), only the between-job figure holds.

* ``ours`` (elastic-run, ``DistributedOptimizer`` + ``TorchState`` committed each step):
  ``none``; ``snapshots`` every 10 s and every 1 s (``--checkpoint-interval``); and
  ``torch_save``: rank 0 writes ``torch.save`` of the model every ~10 s itself, on the
  training path (the synchronous save a torchrun script does).
* ``ddp`` (DistributedDataParallel on gloo, the processes started here): ``none`` and
  ``dcp_async``: ``torch.distributed.checkpoint.async_save`` of the model every ~10 s
  (a collective on its own gloo group).

**Restart.** A job saving every 10 s is SIGKILLed whole (driver and workers, or both DDP
processes) once two saves exist, and the same command is started again: ``restart_s`` is
the time from that start to rank 0's first step done, ``resumed_steps`` the steps it went
on from, ``lost_steps`` how far beyond them the killed job had got (rank 0's progress
lines); ``fresh_s`` is the same time for a start with nothing saved.

One JSON line per configuration on stdout (nothing else):
    {"bench": "snapshot", "measure": "overhead", "system", "save", "interval_s",
     "step_s_median", "overhead_median", "overhead_samples", "in_job_overhead_median",
     "in_job_overhead_samples", "save_cost_ms_median", "saves_median", "load_avg"}
    {"bench": "snapshot", "measure": "restart", "system", "restart_s_median",
     "restart_s_samples", "fresh_s_median", "resumed_steps", "lost_steps", "load_avg"}

    python -m benchmarks.snapshot_bench [--rounds 5] [--steps 300] [--restarts 3]
        [--systems ours ddp]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.jobs import ElasticRun
from benchmarks.harness.paths import ROOT
from benchmarks.harness.processes import THREAD_ENV, free_port, kill_group
from benchmarks.harness.stats import median_or_none
from benchmarks.harness.waits import wait_for
from benchmarks.harness.workdir import bench_workdir

TRAIN = Path(__file__).resolve().parent / "workloads" / "snapshot_train.py"
WORKERS = 2
INTERVAL = 10.0  # seconds between saves, every system
JOB_DEADLINE = 600.0  # one job of --steps steps, start to exit
DDP_STEP_S = 0.25  # DDP's step on the MLP here: its restart job saves every ~10 s
WINDOW_S = 1.5  # after a save, the steps its cost may show in (in_job): its write's span


@dataclass(frozen=True)
class Config:
    system: str  # "ours" | "ddp"
    save: str  # "none" | "snapshots" | "torch_save" | "dcp_async"
    interval_s: float = INTERVAL

    @property
    def name(self) -> str:
        return f"{self.system}/{self.save}@{self.interval_s:g}"


BASELINES = (Config("ours", "none", 0), Config("ddp", "none", 0))
SAVERS = (
    Config("ours", "snapshots"),
    Config("ours", "snapshots", 1.0),
    Config("ours", "torch_save"),
    Config("ddp", "dcp_async"),
)


def train_args(config: Config, steps: int, save_every: int, directory: Path, out: Path):
    return [
        *(sys.executable, str(TRAIN), "--impl", config.system, "--save", config.save),
        *("--steps", str(steps), "--save-every", str(save_every)),
        *("--dir", str(directory), "--out", str(out)),
    ]


def ours_job(config: Config, args: list[str], directory: Path, workdir: Path) -> ElasticRun:
    """elastic-run -np 2 over ARGS; with ``--checkpoint-dir DIRECTORY`` for snapshots."""
    snapshots = (
        ["--checkpoint-dir", str(directory), "--checkpoint-interval", f"{config.interval_s:g}"]
        if config.save == "snapshots"
        else []
    )
    return ElasticRun(["-np", str(WORKERS), *snapshots, *args], workdir, env=THREAD_ENV)


class DdpJob:
    """Two DDP processes on gloo, each in its own session (killed by process group)."""

    def __init__(self, args: list[str], workdir: Path):
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        port = free_port()
        # the workload imports its model from benchmarks/, as under elastic-run
        env = {**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}
        self.procs = []
        for rank in range(WORKERS):
            with open(workdir / f"rank{rank}.log", "w") as log:
                self.procs.append(
                    subprocess.Popen(
                        [*args, "--rank", str(rank), "--world", str(WORKERS), "--port", str(port)],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                )

    def progress(self) -> int:
        """Rank 0's last ``progress <step>`` line."""
        lines = (self.workdir / "rank0.log").read_text().split("progress ")
        return int(lines[-1].split()[0]) if len(lines) > 1 else 0

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        codes = [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in self.procs]
        return max(codes, key=abs)

    def kill(self) -> None:
        for p in self.procs:
            kill_group(p.pid)
        for p in self.procs:
            p.wait(timeout=10)


def overhead_round(
    configs: list[Config], steps: int, workdir: Path, results: dict[str, list[dict]]
) -> None:
    """Run CONFIGS once each, baselines first, recording each run's mean step time."""
    step_s: dict[str, float] = {}
    for config in configs:
        base = step_s.get(config.system)
        save_every = max(1, round(config.interval_s / base)) if base else steps
        folder = workdir / f"{config.name.replace('/', '-')}-{len(results[config.name])}"
        ckpt, out = folder / "ckpt", folder / "result.json"
        ckpt.mkdir(parents=True)
        args = train_args(config, steps, save_every, ckpt, out)
        snapshots = run_to_end(config, args, ckpt, folder)
        result = json.loads(out.read_text())
        durations, saves = result["durations"], snapshots + result["save_steps"]
        mean = statistics.mean(durations)
        if config.save == "none":
            step_s[config.system] = mean
        baseline = step_s[config.system]
        window = max(1, round(WINDOW_S / baseline))
        cost, in_job = cost_in_job(durations, result["first_step"], sorted(saves), window)
        results[config.name].append(
            {
                "step_s": mean,
                "overhead": mean / baseline - 1,
                "in_job": in_job,
                "save_cost_ms": cost * statistics.median(durations) * 1000
                if cost is not None
                else None,
                "saves": len(saves),
            }
        )
        shutil.rmtree(ckpt, ignore_errors=True)


def cost_in_job(
    durations: list[float], first_step: int, saves: list[int], window: int
) -> tuple[float | None, float | None]:
    """What saving cost, read inside one job (see the module docstring): the excess per
    save in median steps, and all saves' excess over the job's whole time. DURATIONS are
    those of steps FIRST_STEP on; a save at step s shows in steps s .. s+WINDOW-1
    (None, None when saves come closer than that, or there are none)."""
    median = statistics.median(durations)
    excess = [d / median - 1 for d in durations]
    windows = []
    for here, after in zip(saves, [*saves[1:], first_step + len(durations)]):
        begin = here - first_step
        if begin >= 0 and here + window <= after:
            windows.append(range(begin, begin + window))
    inside = {i for w in windows for i in w}
    outside = [e for i, e in enumerate(excess) if i not in inside]
    if not windows or not outside or len(windows) < len(saves) // 2:
        return None, None
    usual = statistics.mean(outside)  # the job's own spread: not the saves' doing
    per_save = statistics.mean(sum(excess[i] - usual for i in w) for w in windows)
    return per_save, per_save * len(saves) * median / sum(durations)


def run_to_end(config: Config, args: list[str], ckpt: Path, folder: Path) -> list[int]:
    """Run one job to its end; the steps of the snapshots elastic-run wrote for it."""
    if config.system == "ours":
        with ours_job(config, args, ckpt, folder / "job") as run:
            code = run.wait(timeout=JOB_DEADLINE)
            if code != 0:
                raise RuntimeError(f"{config.name} exited {code}: {run.stderr_tail()}")
            return [event["step"] for event in run.events("snapshot_written")]
    job = DdpJob(args, folder / "job")
    try:
        code = job.wait(JOB_DEADLINE)
    finally:
        job.kill()
    if code != 0:
        raise RuntimeError(f"{config.name} exited {code}")
    return []


def overhead_lines(rounds: int, steps: int, systems: list[str], workdir: Path) -> Iterator[dict]:
    results: dict[str, list[dict]] = defaultdict(list)
    baselines = [c for c in BASELINES if c.system in systems]
    savers = [c for c in SAVERS if c.system in systems]
    for r in range(rounds):
        shift = r % len(savers)
        overhead_round([*baselines, *savers[shift:], *savers[:shift]], steps, workdir, results)
    for config in (*baselines, *savers):
        samples = results[config.name]
        yield {
            "bench": "snapshot",
            "measure": "overhead",
            "system": config.system,
            "save": config.save,
            "interval_s": config.interval_s or None,
            "step_s_median": round(statistics.median(s["step_s"] for s in samples), 4),
            "overhead_median": round(statistics.median(s["overhead"] for s in samples), 4),
            "overhead_samples": [round(s["overhead"], 4) for s in samples],
            "in_job_overhead_median": median_or_none([s["in_job"] for s in samples]),
            "in_job_overhead_samples": [s["in_job"] and round(s["in_job"], 4) for s in samples],
            "save_cost_ms_median": median_or_none([s["save_cost_ms"] for s in samples]),
            "saves_median": statistics.median(s["saves"] for s in samples),
            "load_avg": round(os.getloadavg()[0], 2),
        }


def first_step(path: Path, started: float, timeout: float = 180.0) -> tuple[float, int]:
    """Seconds from STARTED to rank 0's first step, and that step (``--first`` file)."""

    def noted():
        with contextlib.suppress(OSError, ValueError):
            when, step = path.read_text().split()
            return float(when) - started, int(step)
        return None

    return wait_for(noted, timeout, f"a first step in {path}")


def restart_sample(system: str, steps: int, workdir: Path) -> dict:
    """A fresh start, then a job killed whole once it has two saves, then the same
    command again; each timed from its start to rank 0's first step."""
    ckpt, out = workdir / "ckpt", workdir / "result.json"
    ckpt.mkdir(parents=True)
    config = Config(system, "snapshots" if system == "ours" else "dcp_async")
    save_every = max(1, round(INTERVAL / DDP_STEP_S))
    sample: dict = {}
    for attempt in ("fresh", "killed", "restart"):
        first = workdir / f"first-{attempt}"
        args = [*train_args(config, steps, save_every, ckpt, out), "--first", str(first)]
        if system == "ddp" and attempt == "restart":
            args.append("--resume")
        started = time.time()
        if system == "ours":
            with ours_job(config, args, ckpt, workdir / attempt) as run:
                sample[attempt] = first_step(first, started)
                if attempt == "killed":
                    run.wait_event("snapshot_written", timeout=120)
                    run.wait_event("snapshot_written", after=1, timeout=60)
                kill_tree(run)  # no final snapshot: a power cut
                sample[f"{attempt}_reached"] = run.progress
        else:
            job = DdpJob(args, workdir / attempt)
            try:
                sample[attempt] = first_step(first, started)
                if attempt == "killed":
                    wait_for(lambda: len(saves_in(ckpt)) >= 2, 120, "two DCP checkpoints")
            finally:
                job.kill()
            sample[f"{attempt}_reached"] = job.progress()
        if attempt == "fresh":
            shutil.rmtree(ckpt)
            ckpt.mkdir()
    return sample


def saves_in(ckpt: Path) -> list[str]:
    return [name for name in os.listdir(ckpt) if (ckpt / name / ".metadata").exists()]


def kill_tree(run: ElasticRun) -> None:
    """SIGKILL the driver and every worker at once."""
    assert run.proc is not None
    for pid in (run.proc.pid, *run.worker_pids().values()):
        kill_group(pid)
    run.proc.wait(timeout=10)


def restart_lines(samples: int, steps: int, workdir: Path) -> Iterator[dict]:
    for system in ("ours", "ddp"):
        runs = [restart_sample(system, steps, workdir / f"{system}-{i}") for i in range(samples)]
        yield {
            "bench": "snapshot",
            "measure": "restart",
            "system": system,
            "restart_s_median": median_or_none([run["restart"][0] for run in runs]),
            "restart_s_samples": [round(run["restart"][0], 3) for run in runs],
            "fresh_s_median": median_or_none([run["fresh"][0] for run in runs]),
            "resumed_steps": [run["restart"][1] - 1 for run in runs],
            "lost_steps": [run["killed_reached"] - (run["restart"][1] - 1) for run in runs],
            "load_avg": round(os.getloadavg()[0], 2),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved overhead rounds (0: none)"
    )
    parser.add_argument("--steps", type=int, default=300, help="steps per overhead job")
    parser.add_argument(
        "--restarts", type=int, default=3, help="restart samples per system (0: none)"
    )
    parser.add_argument("--systems", nargs="+", choices=["ours", "ddp"], default=["ours", "ddp"])
    parser.add_argument("--keep", action="store_true", help="keep the jobs' folders")
    args = parser.parse_args()
    with bench_workdir("snapshot-bench-", args.keep) as workdir:
        if args.rounds > 0:
            overhead = overhead_lines(args.rounds, args.steps, args.systems, workdir / "overhead")
            for line in overhead:
                print(json.dumps(line), flush=True)
        if args.restarts > 0:
            for line in restart_lines(args.restarts, 100000, workdir / "restart"):
                print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
