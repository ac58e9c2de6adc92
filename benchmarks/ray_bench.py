"""On a real Ray cluster: a node cut to the survivors' next commit, ours (``elastic-run
--ray``) on the test hosts.

**Needs root** (the test hosts are namespaces: run it with sudo and the project's
Python) and Ray (the ``ray`` extra, which the test extra includes); it ends with a
one-line error when either is missing.

Two test hosts (``benchmarks/harness/netns.py``), A running the Ray head (and the
driver: a Ray driver runs on a node of its cluster) and B a Ray node
(``benchmarks/harness/ray_cluster.py``, with health checks that find a silent node in ~3 s).
The job: ``elastic-run --ray A:6379 --slots-per-host 2 -np 4 --min-np 2 python
workloads/steps.py OUT``. Once 4 workers train in one round (each ``--settle-steps``
commits in it), B's link is cut (no FIN, no RST; t0 = ``time.time()`` just before). The
sample: t0 until every survivor on A has committed a step in a newer round. A fresh
cluster and job for each cut.

Ray Train, the peer, restarts its whole worker group from a checkpoint once Ray marks
the node dead (Ray's default health checks: about 30 s; here about 3 s) and polls for new
nodes every 60 s; it is not run here (it needs its own training loop), so the line
carries only ours.

One JSON line on stdout:
    {"bench": "ray", "system": "ours", "measure": "cut", "definition", "median_s",
     "p90_s", "max_s", "samples", "settings", "load_avg"[, "error"]}

    sudo python -m benchmarks.ray_bench [--cuts 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness.commits import CommitLog
from benchmarks.harness.netns import HostsError, NetnsHosts, running_hosts
from benchmarks.harness.paths import ROOT, WORKLOADS
from benchmarks.harness.processes import THREAD_ENV
from benchmarks.harness.ray_cluster import RayCluster
from benchmarks.harness.stats import load_avg, summary
from benchmarks.harness.testhosts import reap, require_root
from benchmarks.harness.waits import STEADY_DEADLINE, BenchTimeout, wait_for
from benchmarks.harness.workdir import bench_workdir

SLOTS = 2
DEFINITION = (
    "B's link cut -> every survivor on A has committed a step in a round newer than the "
    "one B was cut in"
)


def sample_cut(hosts: NetnsHosts, workdir: Path, args: argparse.Namespace) -> float:
    """One cut on a fresh cluster and job; the stall.

    Raises:
        BenchTimeout: no steady round, or no recovery, in time.
    """
    a, b = hosts[0], hosts[1]
    out = workdir / "out"
    out.mkdir(parents=True)
    log = CommitLog(out)
    with RayCluster(a, workdir / "ray") as ray, open(workdir / "driver.out", "w") as driver_out:
        ray.add(b)
        ray.wait_alive(2)
        driver = a.popen(
            [
                *(sys.executable, "-m", "driver.cli", "--ray", ray.address),
                *("--slots-per-host", str(SLOTS), "-np", str(2 * SLOTS), "--min-np", "2"),
                *(sys.executable, str(WORKLOADS / "steps.py"), str(out), "--work", str(args.work)),
            ],
            cwd=ROOT,
            env={**os.environ, **THREAD_ENV},
            stdin=subprocess.DEVNULL,
            stdout=driver_out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:

            def steady() -> tuple[float, list[str]] | None:
                if driver.poll() is not None:
                    raise BenchTimeout(f"elastic-run exited with {driver.returncode}")
                return log.steady_round(2 * SLOTS, args.settle_steps)

            round_id, members = wait_for(steady, STEADY_DEADLINE, "a steady round of 4")
            survivors = [m for m in members if m.startswith(f"{a.address}-")]
            t0 = time.time()
            b.cut()

            def recovered() -> float | None:
                log.poll()
                times = [log.first_commit_after(k, round_id, t0) for k in survivors]
                return None if None in times else max(t for t in times if t is not None)

            done = wait_for(recovered, args.recovery_deadline, "the survivors' newer round")
            return done - t0
        finally:
            (out / "stop").touch()
            try:
                driver.wait(timeout=30)
            except subprocess.TimeoutExpired:
                driver.kill()
                driver.wait(timeout=10)
            b.restore()
            reap(a, b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuts", type=int, default=5)
    ap.add_argument("--settle-steps", type=int, default=20)
    ap.add_argument("--work", type=int, default=160, help="matrix side each step computes")
    ap.add_argument("--recovery-deadline", type=float, default=60.0)
    ap.add_argument("--keep", action="store_true", help="keep the jobs' logs (path on stderr)")
    args = ap.parse_args()
    require_root("ray_bench")
    if importlib.util.find_spec("ray") is None:
        sys.exit(f"ray_bench: Ray is not installed for {sys.executable}: pip install ray==2.58.0")
    result: dict = {
        "bench": "ray",
        "system": "ours",
        "measure": "cut",
        "definition": DEFINITION,
        "settings": {"work": args.work, "settle_steps": args.settle_steps, "slots": SLOTS},
    }
    samples: list[float] = []
    with bench_workdir("ray-bench-", args.keep) as tmp:
        try:
            with running_hosts(2, tmp / "hosts") as hosts:
                hosts.quick_resolver()
                for i in range(args.cuts):
                    samples.append(sample_cut(hosts, tmp / f"cut-{i}", args))
        except (BenchTimeout, HostsError, RuntimeError) as exc:
            result["error"] = str(exc)
    result.update(summary(samples), load_avg=load_avg())
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
