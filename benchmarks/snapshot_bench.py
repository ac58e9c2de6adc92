"""What keeping the state safe costs: snapshots (``elastic-run --checkpoint-dir``) side by
side with a script's own ``torch.save`` and with PyTorch DCP's ``async_save``.

**Overhead.** 2 workers train the 25M-parameter MLP of ``torch_bench.py``
(``workloads/snapshot_train.py``, batch 2 per worker, one thread each) up to
``--steps``; a configuration's overhead is its mean step time (every step, saves
included, after 3 warm-up steps) over the mean step time of its own system's run without
saving in the same round, minus 1. Rounds are interleaved: each runs both baselines first
(their step times turn the 10 s interval into steps for the script-side saves), then
every other configuration in an order that rotates from round to round. ``excess`` is the
same cost read inside each job (its mean step over its median step, less the
baseline's), which the machine's speed drifting from one job to the next does not move.

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
     "step_s_median", "overhead_median", "overhead_samples", "excess_median",
     "excess_samples", "saves_median", "load_avg"}
    {"bench": "snapshot", "measure": "restart", "system", "restart_s_median",
     "restart_s_samples", "fresh_s_median", "resumed_steps", "lost_steps", "load_avg"}

    python benchmarks/snapshot_bench.py [--rounds 5] [--steps 300] [--restarts 3]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from recovery_bench import (  # noqa: E402
    THREAD_ENV,
    bench_workdir,
    free_port,
    kill_group,
    median_or_none,
    wait_for,
)

from tests.support.jobs import ElasticRun  # noqa: E402

TRAIN = Path(__file__).resolve().parent / "workloads" / "snapshot_train.py"
WORKERS = 2
INTERVAL = 10.0  # seconds between saves, every system
JOB_DEADLINE = 600.0  # one job of --steps steps, start to exit
DDP_STEP_S = 0.25  # DDP's step on the MLP here: its restart job saves every ~10 s


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
        env = {**os.environ, **THREAD_ENV}
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
    excess: dict[str, float] = {}
    for config in configs:
        base = step_s.get(config.system)
        save_every = max(1, round(config.interval_s / base)) if base else steps
        folder = workdir / f"{config.name.replace('/', '-')}-{len(results[config.name])}"
        ckpt, out = folder / "ckpt", folder / "result.json"
        ckpt.mkdir(parents=True)
        args = train_args(config, steps, save_every, ckpt, out)
        snapshots = run_to_end(config, args, ckpt, folder)
        result = json.loads(out.read_text())
        durations, saves = result["durations"], snapshots + result["saves"]
        mean, median = statistics.mean(durations), statistics.median(durations)
        if config.save == "none":
            step_s[config.system], excess[config.system] = mean, mean / median - 1
        baseline = step_s[config.system]
        results[config.name].append(
            {
                "step_s": mean,
                "overhead": mean / baseline - 1,
                # The same cost seen inside the job: its steps' mean over their median,
                # less the baseline's; immune to the machine's speed drifting between jobs.
                "excess": mean / median - 1 - excess[config.system],
                "saves": saves,
            }
        )
        shutil.rmtree(ckpt, ignore_errors=True)


def run_to_end(config: Config, args: list[str], ckpt: Path, folder: Path) -> int:
    """Run one job to its end; the snapshots elastic-run wrote for it."""
    if config.system == "ours":
        with ours_job(config, args, ckpt, folder / "job") as run:
            code = run.wait(timeout=JOB_DEADLINE)
            if code != 0:
                raise RuntimeError(f"{config.name} exited {code}: {run.stderr_tail()}")
            return len(run.events("snapshot_written"))
    job = DdpJob(args, folder / "job")
    try:
        code = job.wait(JOB_DEADLINE)
    finally:
        job.kill()
    if code != 0:
        raise RuntimeError(f"{config.name} exited {code}")
    return 0


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
            "excess_median": round(statistics.median(s["excess"] for s in samples), 4),
            "excess_samples": [round(s["excess"], 4) for s in samples],
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
