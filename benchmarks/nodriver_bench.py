"""Training throughput with no driver running vs with one (etcd store).

With an etcd store the workers need the driver only when membership changes: between
changes they train peer to peer, and the per-host agent (which outlives the driver)
keeps them. This benchmark measures what the driver's presence costs or gives while the
world is steady.

One job per configuration, on a real etcd (``benchmarks.harness.etcd_cluster``, loopback):
``-np N`` workers of ``workloads/steps.py`` (each step a small matrix product, one
allreduce, a commit, and a timestamped line in the worker's own ``*.commits`` log).
Then, ``--samples`` times, interleaved:

* **with**: a driver leads (the first one starts the job; each later one is the same
  command started again, which adopts the running job). ``--settle`` seconds after its
  ``leading`` event, a window of ``--window`` seconds;
* **without**: the driver is SIGKILLed; ``--settle`` seconds after, a window of the same
  length, with no driver process at all.

Throughput of a window = the distinct global steps whose commit time (from the workers'
own logs, not from anything routed through a driver) falls in the window, divided by
its length. Reported per configuration: the medians of both phases, ``ratio`` =
median(without) / median(with), and ``paired_ratio_median``, the median of each
sample's without / with (two adjacent windows: load that drifts over the run, on a
machine shared with other work, cancels out of it).

"Unchanged" means the paired ratio is within the noise of the measurement itself:
``noise`` is the relative median absolute deviation of the with-driver samples
(median(|x - median|) / median: how much one condition varies from window to window,
robust to a window that another process on the machine slowed down), and
``unchanged`` is ``abs(paired_ratio_median - 1) <= noise``. The driver process (idle between membership
changes, but beating its lease) is the only difference between the phases.

One JSON line per configuration on stdout:
    {"bench": "nodriver", "workers", "window_s", "samples", "with_steps_s_median",
     "without_steps_s_median", "ratio", "paired_ratio_median", "noise", "unchanged", "with_steps_s": [...],
     "without_steps_s": [...], "load_avg"[, "error"]}

    python -m benchmarks.nodriver_bench [--samples 5] [--workers 2 4] [--window 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from benchmarks.harness.commits import CommitLog
from benchmarks.harness.etcd_cluster import EtcdCluster
from benchmarks.harness.jobs import ElasticRun, pid_alive
from benchmarks.harness.paths import STEPS
from benchmarks.harness.processes import THREAD_ENV, kill_group
from benchmarks.harness.waits import BenchTimeout, wait_for
from benchmarks.harness.workdir import bench_workdir
from rendezvous import open_store
from rendezvous.keys import JobKeys
from rendezvous.schema.agents import AgentRecord

DEADLINE = 60.0  # any wait: a job's start, a lease's lapse, an adoption, the finish
DRIVER_TIMEOUT = 600  # agents keep their workers this long with no driver: all of the run


class DriverlessJob:
    """One job on ``url`` whose driver comes and goes (see the module docstring)."""

    def __init__(self, url: str, workers: int, workdir: Path):
        self.url = url
        self.workers = workers
        self.workdir = workdir
        self.keys = JobKeys(f"b{uuid.uuid4().hex[:10]}")
        self.out = workdir / "out"
        self.out.mkdir(parents=True)
        self.log = CommitLog(self.out)
        self.args = [
            *("-np", str(workers), "--rendezvous", url, "--job-id", self.keys.job_id),
            *("--driver-timeout", str(DRIVER_TIMEOUT)),
            *(sys.executable, str(STEPS), str(self.out)),
        ]
        self.env = {**THREAD_ENV, "ELASTIC_JOB_SECRET": uuid.uuid4().hex * 2}
        self.drivers: list[ElasticRun] = []
        self.agent_pids: set[int] = set()

    def _read(self, key: str):
        with open_store(self.url) as store:
            return store.get(key)

    def lead(self) -> float:
        """Start a driver (after the last one's lease lapsed) and wait until it leads
        with the whole world training; the time of its ``leading`` event."""
        if self.drivers:
            wait_for(lambda: self._read(self.keys.driver) is None, DEADLINE, "the lease to lapse")
        run = ElasticRun(self.args, self.workdir / f"d{len(self.drivers)}", env=self.env)
        self.drivers.append(run.start())
        leading = run.wait_event("leading", timeout=DEADLINE)
        if not self.agent_pids:
            with open_store(self.url) as store:
                kvs, _ = store.get_prefix(self.keys.agents)
            self.agent_pids = {AgentRecord.from_json(kv.value).pid for kv in kvs}
        wait_for(self._all_training, DEADLINE, f"{self.workers} workers to commit steps")
        return leading["t"]

    def _all_training(self) -> bool:
        self.log.poll()
        return len(self.log.records) == self.workers and all(
            any(True for _ in self.log.commits(key)) for key in self.log.records
        )

    def kill_driver(self) -> float:
        proc = self.drivers[-1].proc
        assert proc is not None
        t = time.time()
        proc.kill()
        proc.wait(timeout=DEADLINE)
        return t

    def steps_per_s(self, start: float, length: float) -> float:
        """Distinct committed steps logged within [start, start + length), per second
        (waits until the window has passed)."""
        time.sleep(max(0.0, start + length - time.time()))  # the window itself
        wait_for(lambda: self._logged_past(start + length), DEADLINE, "a commit past the window")
        steps = {
            r["step"]
            for key in self.log.records
            for r in self.log.commits(key)
            if start <= r["t"] < start + length
        }
        return len(steps) / length

    def _logged_past(self, t: float) -> bool:
        self.log.poll()
        return any(r["t"] >= t for key in self.log.records for r in self.log.commits(key))

    def finish(self) -> None:
        """End the job through the workload's stop file, under the current driver."""
        (self.out / "stop").touch()
        code = self.drivers[-1].wait(timeout=DEADLINE)
        if code != 0:
            raise BenchTimeout(f"elastic-run exited {code}: {self.drivers[-1].stderr_tail(5)}")

    def stop(self) -> None:
        """Reap everything of the job by pid: drivers, agents, workers."""
        for run in self.drivers:
            run.stop()
        for pid in self.agent_pids:
            if pid_alive(pid):
                kill_group(pid)
        self.log.poll()
        for key in list(self.log.records):
            start = self.log.event(key, "start")
            if start and pid_alive(start["pid"]):
                kill_group(start["pid"])


def configuration(url: str, workers: int, samples: int, window: float, settle: float, workdir):
    line: dict = {"bench": "nodriver", "workers": workers, "window_s": window}
    with_driver: list[float] = []
    without: list[float] = []
    job = DriverlessJob(url, workers, workdir)
    try:
        for _ in range(samples):
            led = job.lead()
            with_driver.append(job.steps_per_s(max(led, time.time()) + settle, window))
            killed = job.kill_driver()
            without.append(job.steps_per_s(killed + settle, window))
        job.lead()
        job.finish()
    except (AssertionError, BenchTimeout, RuntimeError, OSError) as exc:
        line["error"] = str(exc).splitlines()[0][:300]
    finally:
        job.stop()
    n = min(len(with_driver), len(without))
    if n:
        with_median = statistics.median(with_driver)
        without_median = statistics.median(without)
        ratio = without_median / with_median if with_median else None
        pairs = [b / a for a, b in zip(with_driver[:n], without[:n], strict=True) if a]
        paired = statistics.median(pairs) if pairs else None
        deviation = statistics.median(abs(x - with_median) for x in with_driver)
        noise = deviation / with_median if with_median else None
        line.update(
            samples=n,
            with_steps_s_median=round(with_median, 2),
            without_steps_s_median=round(without_median, 2),
            ratio=round(ratio, 3) if ratio is not None else None,
            paired_ratio_median=round(paired, 3) if paired is not None else None,
            noise=round(noise, 3) if noise is not None else None,
            unchanged=paired is not None and noise is not None and abs(paired - 1) <= noise,
            with_steps_s=[round(x, 2) for x in with_driver],
            without_steps_s=[round(x, 2) for x in without],
        )
    line["load_avg"] = round(os.getloadavg()[0], 2)
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5, help="windows of each phase")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--window", type=float, default=3.0, help="seconds a window lasts")
    parser.add_argument(
        "--settle",
        type=float,
        default=0.5,
        help="seconds from a driver's start or death to a window",
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs (path on stderr)")
    args = parser.parse_args()
    if args.samples < 1 or args.window <= 0 or args.settle < 0:
        parser.error("--samples must be at least 1, --window positive, --settle not negative")
    with (
        bench_workdir("nodriver-bench-", args.keep) as workdir,
        EtcdCluster(1, workdir / "etcd") as cluster,
    ):
        for workers in args.workers:
            line = configuration(
                cluster.url,
                workers,
                args.samples,
                args.window,
                args.settle,
                workdir / f"np{workers}",
            )
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
