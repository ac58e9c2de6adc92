"""Recovery time after a worker's SIGKILL: ours (elastic-run) side by side with torchrun.

A job runs a training loop that logs the wall-clock time of every commit
(``workloads/steps.py`` for ours, ``workloads/torch_steps.py`` for torchrun). Once the
world is steady (all N workers in one round, each with ``--settle-steps`` commits in
it), the benchmark SIGKILLs a random member of the current round, waits for recovery,
and repeats ``--kills`` times; then it ends the job through a stop file (all workers
leave on the same step) and reaps every process.

Definition (``recovery_s``, the samples; t0 = ``time.time()`` just before ``kill``):

* ``min-np`` (ours, ``elastic-run -np N --min-np 2``; ``--min-np 1`` for N=2): the time
  until every survivor has committed a step in a round newer than the one the victim
  was killed in. Survivors go on without waiting for the replacement (the driver
  still starts one; the benchmark waits for it to join before the next kill, so
  every kill hits a world of N).
* ``replace`` (ours, plain ``elastic-run -np N``): the world waits for the replacement
  worker (a fresh process), so the time is until every member of the first round
  formed after the kill has committed a step in it (the re-formed world's first commit).
* ``spares`` (ours, ``elastic-run -np N --spares 1``): as ``replace``, but a warm spare
  (started, imported and registered beforehand) takes the victim's place instead of a
  fresh process; the benchmark waits for the new spare started behind it to be ready
  before the next kill, so every kill finds one.
* ``torchrun-restart`` (``torchrun --nnodes=1:1 --nproc-per-node=N --max-restarts=K
  --rdzv-backend=c10d``, run as ``python -m torch.distributed.run``): the agent stops
  the whole group and starts N fresh processes that resume from the checkpoint; the
  time is until each rank of the restarted group has committed a step.

A commit "in round R" is one the worker logged while its communicator belonged to
round R (ours) or restart number R (torchrun), so a step that completes in the old
round after the kill does not count as recovery.

Also reported, as medians over the same kills: ours ``failure_seen_s`` (kill to the
driver's ``worker_failed`` event) and ``round_formed_s`` (kill to the ``round_formed``
event of the next round), and in ``replace`` mode the replacement's start:
``replacement_spawned_s`` (kill to the driver's ``worker_started``), ``..._start_s``
(its interpreter reached the script), ``..._init_s`` (numpy and elastic imported,
calling ``elastic.init()``), ``..._joined_s`` (``init()`` returned); torchrun
``restarted_s`` (kill to the last new worker process running the script),
``imported_s`` (... with torch imported, model and optimizer built) and ``ready_s``
(... with its gloo group up and the checkpoint loaded); in ``spares`` mode
``spare_promoted_s`` (kill to the driver's ``spare_promoted``) instead of the
replacement's start.

One JSON line per configuration on stdout (nothing else):
    {"bench": "recovery", "system": "ours"|"torchrun", "mode": "min-np"|"replace"|"spares"|
     "torchrun-restart", "workers", "kills", "definition", "median_s", "p90_s", "max_s",
     "samples", ...phase medians..., "job_exit", "load_avg"[, "error"]}

    python -m benchmarks.recovery_bench [--kills 5] [--workers 2 4] [--systems ours torchrun]
        [--modes min-np replace spares]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness.commits import CommitLog
from benchmarks.harness.jobs import pid_alive
from benchmarks.harness.ours import OursJob, fresh_worker_phases, phase_medians
from benchmarks.harness.paths import ROOT, TORCH_STEPS
from benchmarks.harness.processes import THREAD_ENV, free_port, kill_group
from benchmarks.harness.stats import median_or_none, summary
from benchmarks.harness.waits import (
    FINISH_DEADLINE,
    RECOVERY_DEADLINE,
    STEADY_DEADLINE,
    BenchTimeout,
    wait_for,
)
from benchmarks.harness.workdir import bench_workdir

DEFINITIONS = {
    "min-np": "SIGKILL -> every survivor has committed a step in a round newer than the kill round",
    "replace": "SIGKILL -> every member of the first round formed after the kill "
    "(survivors + the fresh replacement) has committed a step in it",
    "spares": "SIGKILL -> every member of the first round formed after the kill "
    "(survivors + the promoted spare) has committed a step in it",
    "torchrun-restart": "SIGKILL -> every rank of the restarted worker group has committed "
    "a step (resumed from the per-step checkpoint)",
}


def ours_config(
    mode: str, workers: int, kills: int, settle: int, work: int, rng: random.Random, tmp: Path
) -> dict:
    args = ["-np", str(workers)]
    if mode == "min-np":
        args += ["--min-np", str(2 if workers > 2 else 1)]
    spares = 1 if mode == "spares" else 0
    if spares:
        args += ["--spares", str(spares)]
    job = OursJob(args, tmp / f"ours-{mode}-{workers}", work)
    samples, seen, formed, fresh, promoted = [], [], [], [], []
    result = {
        "bench": "recovery",
        "system": "ours",
        "mode": mode,
        "workers": workers,
        "elastic_run_args": args,
        "definition": DEFINITIONS[mode],
    }
    try:
        job.start()
        for _ in range(kills):
            current = wait_for(
                lambda: job.steady(workers, settle, spares),
                STEADY_DEADLINE,
                f"a steady round of {workers}"
                + (f" and {spares} ready spare(s)" if spares else ""),
            )
            round_id, members = current["round"], current["members"]
            victim = rng.choice(members)
            pid = job.run.worker_pids()[victim]
            survivors = [m for m in members if m != victim]
            t0 = time.time()
            os.kill(pid, signal.SIGKILL)

            def recovered(survivors=survivors, round_id=round_id, t0=t0):
                job.check_running()
                job.log.poll()
                if mode == "min-np":
                    waited = survivors
                else:
                    nxt = next((r for r in job.rounds() if r["round"] > round_id), None)
                    if nxt is None:
                        return None
                    waited = nxt["members"]
                times = [job.log.first_commit_after(m, round_id, t0) for m in waited]
                return None if None in times else max(times)

            done = wait_for(recovered, RECOVERY_DEADLINE, f"recovery from killing {victim}")
            samples.append(done - t0)
            failed = next(
                (e for e in job.run.events("worker_failed") if e["worker"] == victim), None
            )
            seen.append(failed["t"] - t0 if failed else None)
            nxt = next((r for r in job.rounds() if r["round"] > round_id), None)
            formed.append(nxt["t"] - t0 if nxt else None)
            if mode == "replace" and nxt:
                fresh.append(fresh_worker_phases(job, set(nxt["members"]) - set(members), t0))
            if mode == "spares":
                took = [e["t"] - t0 for e in job.run.events("spare_promoted") if e["t"] >= t0]
                promoted.append(took[0] if took else None)
        result["job_exit"] = job.finish()
    except BenchTimeout as exc:
        result["error"] = str(exc)
    finally:
        job.stop()
    result.update(
        kills=len(samples),
        **summary(samples),
        failure_seen_s=median_or_none(seen),
        round_formed_s=median_or_none(formed),
        **phase_medians(fresh, "replacement_"),
        **({"spare_promoted_s": median_or_none(promoted)} if mode == "spares" else {}),
        load_avg=round(os.getloadavg()[0], 2),
    )
    return result


# --------------------------------------------------------------------------- torchrun


class TorchrunJob:
    """``torchrun`` (``python -m torch.distributed.run``) running ``workloads/torch_steps.py``
    in its own process group; its workers run in sessions of their own (torch's
    subprocess handler), so ``stop()`` also signals each worker the logs name."""

    def __init__(self, workers: int, max_restarts: int, workdir: Path, work: int):
        self.workers = workers
        self.workdir = workdir
        self.out = workdir / "out"
        self.out.mkdir(parents=True)
        self.log = CommitLog(self.out)
        self.argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1:1",
            f"--nproc-per-node={workers}",
            f"--max-restarts={max_restarts}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            str(TORCH_STEPS),
            str(self.out),
            "--work",
            str(work),
        ]
        # Without it a restarted gloo group on one node reads the dead workers'
        # addresses from the agent's shared store and usually hangs (pytorch #135712).
        self.env = {**os.environ, **THREAD_ENV, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        self.proc: subprocess.Popen | None = None

    def start(self) -> TorchrunJob:
        # Open until stop(): torchrun writes to them for the whole run.
        self._out = open(self.workdir / "stdout.log", "w")  # noqa: SIM115
        self._err = open(self.workdir / "stderr.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=self.env,
            stdout=self._out,
            stderr=self._err,
            start_new_session=True,
        )
        return self

    def group_members(self, group: float) -> dict[int, dict]:
        """rank -> start record of the workers of restart number ``group``."""
        members = {}
        for key, recs in self.log.records.items():
            start = next((r for r in recs if r["ev"] == "start"), None)
            if start and start["round"] == group:
                members[start["rank"]] = {"key": key, **start}
        return members

    def stderr_tail(self, lines: int = 5) -> str:
        try:
            return "\n".join((self.workdir / "stderr.log").read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def check_running(self) -> None:
        assert self.proc is not None, "start() first"
        if self.proc.poll() is not None:
            raise BenchTimeout(
                f"torchrun exited with {self.proc.returncode}: " + self.stderr_tail()
            )

    def steady(self, settle: int):
        self.check_running()
        self.log.poll()
        group = self.log.max_round
        members = self.group_members(group)
        if len(members) != self.workers:
            return None
        if all(self.log.count_in_round(m["key"], group) >= settle for m in members.values()):
            return group, members
        return None

    def finish(self) -> int | None:
        (self.out / "stop").touch()
        assert self.proc is not None, "start() first"
        try:
            return self.proc.wait(timeout=FINISH_DEADLINE)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # SIGTERM first: the agent then stops its workers itself.
            kill_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.poll()
        for key in list(self.log.records):
            start = self.log.event(key, "start")
            if start and pid_alive(start["pid"]):
                kill_group(start["pid"])
        for f in (getattr(self, "_out", None), getattr(self, "_err", None)):
            if f is not None:
                f.close()


def torchrun_config(
    workers: int, kills: int, settle: int, work: int, rng: random.Random, tmp: Path
) -> dict:
    job = TorchrunJob(workers, kills + 2, tmp / f"torchrun-{workers}", work)
    samples: list[float] = []
    restarted: list[float] = []
    imported: list[float | None] = []
    ready: list[float | None] = []
    result = {
        "bench": "recovery",
        "system": "torchrun",
        "mode": "torchrun-restart",
        "workers": workers,
        "max_restarts": kills + 2,
        "definition": DEFINITIONS["torchrun-restart"],
    }
    try:
        job.start()
        for _ in range(kills):
            group, members = wait_for(
                lambda: job.steady(settle), STEADY_DEADLINE, f"a steady torchrun group of {workers}"
            )
            victim = members[rng.randrange(workers)]
            t0 = time.time()
            os.kill(victim["pid"], signal.SIGKILL)

            def recovered(group=group, t0=t0):
                job.check_running()
                job.log.poll()
                nxt = job.group_members(group + 1)
                if len(nxt) != workers:
                    return None
                times = [job.log.first_commit_after(m["key"], group, t0) for m in nxt.values()]
                return None if None in times else (max(times), nxt)

            done, nxt = wait_for(
                recovered,
                RECOVERY_DEADLINE,
                f"torchrun recovery from killing rank {victim['rank']}",
            )
            samples.append(done - t0)
            restarted.append(max(m["t"] for m in nxt.values()) - t0)
            for phase, out in (("imported", imported), ("ready", ready)):
                recs = [job.log.event(m["key"], phase) for m in nxt.values()]
                out.append(max(r["t"] for r in recs) - t0 if all(recs) else None)
        result["job_exit"] = job.finish()
    except BenchTimeout as exc:
        result["error"] = str(exc)
    finally:
        job.stop()
    result.update(
        kills=len(samples),
        **summary(samples),
        restarted_s=median_or_none(restarted),
        imported_s=median_or_none(imported),
        ready_s=median_or_none(ready),
        load_avg=round(os.getloadavg()[0], 2),
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=5, help="SIGKILLs per configuration")
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    ap.add_argument(
        "--systems", nargs="+", default=["ours", "torchrun"], choices=["ours", "torchrun"]
    )
    ap.add_argument(
        "--modes",
        nargs="+",
        default=["min-np", "replace", "spares"],
        choices=["min-np", "replace", "spares"],
        help="ours' configurations",
    )
    ap.add_argument(
        "--settle-steps",
        type=int,
        default=20,
        help="commits every member makes in a round before the next kill",
    )
    ap.add_argument(
        "--work", type=int, default=160, help="side of the matrix product each step computes"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the jobs' logs (path on stderr)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with bench_workdir("recovery-bench-", args.keep) as tmp:
        for workers in args.workers:
            if "ours" in args.systems:
                for mode in args.modes:
                    print(
                        json.dumps(
                            ours_config(
                                mode, workers, args.kills, args.settle_steps, args.work, rng, tmp
                            )
                        ),
                        flush=True,
                    )
            if "torchrun" in args.systems:
                print(
                    json.dumps(
                        torchrun_config(workers, args.kills, args.settle_steps, args.work, rng, tmp)
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
