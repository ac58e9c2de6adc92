"""Driver failover time: SIGKILL of the leading ``elastic-run`` to its standby leading.

A job runs on a real etcd (``benchmarks.harness.etcd_cluster``): a leader with ``-np N
--min-np 1`` workers (run by the per-host agent, which outlives the driver) in a first
round, training held by a pause file so the job never ends under the benchmark, and a
standby (``--standby``, same ``--job-id`` and job secret) waiting on it. The benchmark
SIGKILLs the leader's process (t0 = ``time.time()`` just before), and, as soon as the
standby leads, SIGKILLs a worker; it reads the standby's events:

* ``leading_s`` (the figure): t0 to the standby's ``leading`` event, emitted once it
  holds the lead (term + 1), has rebuilt the job's view from the store and adopted the
  workers: the next message its loop handles can form a round;
* ``vacant_to_leading_s``: the standby's own share of it (the leader key seen deleted
  to ``leading``); the rest is the leader's lease running out in etcd;
* ``round_s``: t0 to the standby's first ``round_formed``: the round of the survivors
  it forms once the agent reports the worker's death (proof that it steers);
  ``kill_to_round_s`` is that round's share after the worker's SIGKILL.

The leader's lease is ``driver.leadership.claim.DRIVER_LEASE_TTL``, raised by etcd to its minimum
(1.5 x the election timeout, rounded up to a second); the standby ends it itself once
the leader's beat has been silent for ``driver.leadership.standby.BEAT_SILENCE``. A configuration
per etcd timing: the tests' fast one (50/500 ms: 1 s leases) and etcd's default
(100/1000 ms: 2 s leases).

One JSON line per configuration on stdout:
    {"bench": "failover", "workers", "etcd_timing_ms", "samples", "median_s", "p90_s",
     "max_s", "leading_s": [...], "vacant_to_leading_s_median", "round_s_median",
     "kill_to_round_s_median", "load_avg"[, "error"]}

    python -m benchmarks.failover_bench [--samples 5] [--workers 2] [--timing fast default]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.harness.etcd_cluster import EtcdCluster
from benchmarks.harness.jobs import ElasticRun, exact_sum_command, pid_alive

TIMINGS = {"fast": (50, 500), "default": (100, 1000)}
DEADLINE = 60.0


def one_failover(url: str, workers: int, workdir: Path) -> dict:
    """One leader SIGKILLed under its standby; the sample's times (seconds)."""
    job_id = f"b{uuid.uuid4().hex[:10]}"
    out = workdir / "out"
    out.mkdir(parents=True)
    (out / "pause").touch()  # training held: the job outlives the sample
    command = exact_sum_command(out, 400, 1000, "--pause-while", str(out / "pause"))
    size = ["-np", str(workers), "--min-np", "1"]
    args = [*size, "--rendezvous", url, "--job-id", job_id, *command]
    secret = {"ELASTIC_JOB_SECRET": uuid.uuid4().hex * 2}
    leader = ElasticRun(args, workdir / "leader", env=secret)
    standby = ElasticRun(["--standby", *args], workdir / "standby", env=secret)
    try:
        leader.start()
        leader.wait_event("round_formed", timeout=DEADLINE)
        standby.start()
        standby.wait_event("standing_by", timeout=DEADLINE)
        assert leader.proc is not None
        t0 = time.time()
        os.kill(leader.proc.pid, signal.SIGKILL)
        leading = standby.wait_event("leading", timeout=DEADLINE)
        victim, pid = sorted(standby.worker_pids().items())[-1]
        t1 = time.time()
        os.kill(pid, signal.SIGKILL)
        formed = standby.wait_event(
            "round_formed", lambda e: victim not in e["members"], timeout=DEADLINE
        )
        return {
            "leading_s": round(leading["t"] - t0, 3),
            "vacant_to_leading_s": leading["seconds"],
            "round_s": round(formed["t"] - t0, 3),
            "kill_to_round_s": round(formed["t"] - t1, 3),
        }
    finally:
        standby.stop()
        leader.stop()
        for pid in {**leader.worker_pids(), **standby.worker_pids()}.values():
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


def configuration(timing: str, workers: int, samples: int, workdir: Path) -> dict:
    line: dict = {"bench": "failover", "workers": workers, "etcd_timing_ms": TIMINGS[timing]}
    runs: list[dict] = []
    try:
        with EtcdCluster(1, workdir / "etcd", timing_ms=TIMINGS[timing]) as cluster:
            for i in range(samples):
                runs.append(one_failover(cluster.url, workers, workdir / f"s{i}"))
    except (AssertionError, RuntimeError, OSError) as exc:
        line["error"] = str(exc).splitlines()[0][:300]
    leading = sorted(r["leading_s"] for r in runs)
    if leading:
        line.update(
            samples=len(leading),
            median_s=round(statistics.median(leading), 3),
            p90_s=leading[min(len(leading) - 1, int(0.9 * len(leading)))],
            max_s=leading[-1],
            leading_s=[r["leading_s"] for r in runs],
            vacant_to_leading_s_median=round(
                statistics.median(r["vacant_to_leading_s"] for r in runs), 3
            ),
            round_s_median=round(statistics.median(r["round_s"] for r in runs), 3),
            kill_to_round_s_median=round(statistics.median(r["kill_to_round_s"] for r in runs), 3),
        )
    line["load_avg"] = round(os.getloadavg()[0], 2)
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--timing", nargs="+", choices=sorted(TIMINGS), default=["fast", "default"])
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="failover-bench-"))
    try:
        for timing in args.timing:
            for workers in args.workers:
                line = configuration(timing, workers, args.samples, workdir / f"{timing}-{workers}")
                print(json.dumps(line), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
