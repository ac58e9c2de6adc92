"""The false-alarm run: 4 loaded workers on 2 cores for a while; nobody may be declared lost.

A host cut is noticed because a ring neighbour goes silent (``CommSettings.suspect_after``,
0.8 s without a heartbeat) and the driver's probe of its host then goes unanswered. The
claim checked here is the other side: a worker that is merely busy or paused costs at
most a silent report and a probe, never a worker. ``elastic-run -np 4 --min-np 2`` runs
``workloads/steps.py`` loaded the way training code loads a process, every step:

* busy numpy compute: a ``--work`` x ``--work`` matrix product (one BLAS thread per
  worker, as in the other benchmarks: 4 workers on 2 cores, each wanting a core);
* a pure-Python loop of ``--python-loop`` iterations (it holds the GIL, handing it to the
  heartbeat thread only at the interpreter's switch interval);
* every ``--gc-every`` steps, a forced full ``gc.collect()`` over a graph of
  ``--gc-objects`` live linked objects: a pause that holds the GIL throughout, staggered
  by rank so that the others are awake to notice the silence.

Placement: ``--placement test-hosts`` (the default; **needs root**: the hosts are network
and PID namespaces, so run it with sudo and the project's Python; without root it ends
with a one-line error) runs 2 workers on each
of 2 test hosts (``benchmarks/harness/netns.py``) over ssh, so the ring, its heartbeats
and the driver's probes cross the hosts' network; ``--placement local`` runs the 4 workers
on this machine.

After ``--duration`` seconds of training (from the first round of 4) the job is ended
through the stop file, and the driver's events file is counted:

* ``silent_reports``: ``failure_reported`` events of a silent peer (reason "silent for
  ...s"): allowed under load, each costs at most one probe;
* ``probes_at_most``: those of them about a member of the round then current, the only
  ones that start a probe (one is not started while a probe of the same host is under
  way, and the driver does not log probes: an upper bound);
* ``other_failure_reports``: any other ``failure_reported``;
* ``host_unreachable``, ``worker_failed``, ``workers_stopped`` (the driver's
  ``worker_stopping``: a kill), ``hung`` (a worker declared hung at the default
  ``--hang-timeout``), ``rounds_beyond_first`` (``round_formed`` events after the
  first);
* ``spurious_losses``: the sum of the last five. The claim holds when it is 0. Each is
  also placed in time (``loss_times_s``, seconds into the run) beside the load average
  then (``load_avg_at_losses``): the claim is about 4 workers on 2 cores, and a machine
  that other work overloads stretches a GC pause past the registration lease
  (``ELASTIC_LEASE_TTL``, 10 s), which expels the worker.

Also reported: committed steps and steps/s, the longest gap between two commits of one
worker (``max_commit_gap_s``), the forced collections' count, median and longest pause,
and the load average (median and highest while training, and at the end). One JSON line
on stdout:
    {"bench": "false_alarm", "placement", "workers": 4, "duration_s", "workload",
     "silent_reports", "probes_at_most", "other_failure_reports", "host_unreachable",
     "worker_failed", "workers_stopped", "hung", "rounds_beyond_first", "spurious_losses",
     "loss_times_s", "load_avg_at_losses",
     "steps", "steps_per_s", "max_commit_gap_s", "gc_pauses", "gc_pause_median_s",
     "gc_pause_max_s", "job_exit", "load_avg_median", "load_avg_max", "load_avg"[, "error"]}

    sudo python -m benchmarks.false_alarm_run [--duration 600] [--placement test-hosts]
    python -m benchmarks.false_alarm_run --duration 30 --placement local   # about a minute
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.harness.jobs import wait_until
from benchmarks.harness.netns import HostsError, NetnsHosts, running_hosts
from benchmarks.harness.ours import OursJob
from benchmarks.harness.testhosts import reap, require_root
from benchmarks.harness.waits import STEADY_DEADLINE, BenchTimeout, wait_for
from benchmarks.harness.workdir import bench_workdir

WORKERS = 4
SLOTS = 2  # workers per test host
HOSTS = WORKERS // SLOTS
#: how long the job may take to end through its stop file past a GC pause or two
END_GRACE = 60.0


def job_settings(hosts: NetnsHosts | None) -> tuple[list[str], dict[str, str], bool]:
    """``elastic-run`` arguments, extra environment, and whether the workers are local."""
    args = ["-np", str(WORKERS), "--min-np", "2"]
    if hosts is None:
        return args, {}, True
    a, b = hosts[0], hosts[1]
    return (
        ["-H", f"{a.address}:{SLOTS},{b.address}:{SLOTS}", *args, "--launcher", "ssh"],
        {"ELASTIC_SSH_OPTIONS": hosts.ssh_options},
        False,
    )


def count_events(events: list[dict]) -> dict:
    """The counts of the module docstring, from the driver's events (in file order)."""
    rounds = [e for e in events if e["kind"] == "round_formed"]
    reports = [e for e in events if e["kind"] == "failure_reported"]
    silent = [e for e in reports if str(e.get("reason")).startswith("silent")]

    def current_round(t: float) -> dict | None:
        return next((r for r in reversed(rounds) if r["t"] <= t), None)

    probes = 0
    for report in silent:
        current = current_round(report["t"])
        if current and report["round"] == current["round"]:
            probes += report["suspect"] in current["members"]
    counts = {
        "silent_reports": len(silent),
        "probes_at_most": probes,
        "other_failure_reports": len(reports) - len(silent),
        "host_unreachable": sum(e["kind"] == "host_unreachable" for e in events),
        "worker_failed": sum(e["kind"] == "worker_failed" for e in events),
        "workers_stopped": sum(e["kind"] == "worker_stopping" for e in events),
        "hung": sum(e["kind"] == "hung" for e in events),
        "rounds_beyond_first": max(0, len(rounds) - 1),
    }
    counts["spurious_losses"] = len(losses(events))
    return counts


def losses(events: list[dict]) -> list[dict]:
    """The events that make ``spurious_losses``: a host declared unreachable, a worker
    failed, stopped or declared hung, a round formed after the first (a worker whose registration
    lapsed is left out of a new round without any report)."""
    first = next((e for e in events if e["kind"] == "round_formed"), None)
    kinds = ("host_unreachable", "worker_failed", "worker_stopping", "hung", "round_formed")
    return [e for e in events if e["kind"] in kinds and e is not first]


def loads_at(samples: list[tuple[float, float]], times: list[float]) -> list[float | None]:
    """The 1-minute load average sampled last before each of ``times`` (None: before the
    first sample)."""
    return [
        next((round(load, 2) for t, load in reversed(samples) if t <= at), None) for at in times
    ]


def training_stats(records: dict[str, list[dict]], begin: float, end: float) -> dict:
    """Steps, steps/s over [begin, end], the longest gap between two commits of one
    worker, and the forced collections' pauses, from the workers' logs."""
    commits = {k: [r for r in recs if r["ev"] == "commit"] for k, recs in records.items()}
    steps = max((r["step"] for recs in commits.values() for r in recs), default=0)
    within = [r["step"] for recs in commits.values() for r in recs if begin <= r["t"] <= end]
    gaps = [
        later["t"] - earlier["t"]
        for recs in commits.values()
        for earlier, later in zip(recs, recs[1:])
    ]
    pauses = [r["seconds"] for recs in records.values() for r in recs if r["ev"] == "gc"]
    return {
        "steps": steps,
        "steps_per_s": round((max(within) - min(within)) / (end - begin), 2)
        if len(within) > 1 and end > begin
        else None,
        "max_commit_gap_s": round(max(gaps), 3) if gaps else None,
        "gc_pauses": len(pauses),
        "gc_pause_median_s": round(statistics.median(pauses), 3) if pauses else None,
        "gc_pause_max_s": round(max(pauses), 3) if pauses else None,
    }


def run(args: argparse.Namespace, tmp: Path, hosts: NetnsHosts | None) -> dict:
    job_args, env, local = job_settings(hosts)
    workload = {
        "work": args.work,
        "python_loop": args.python_loop,
        "gc_objects": args.gc_objects,
        "gc_every": args.gc_every,
    }
    workload_args = [
        *("--python-loop", str(args.python_loop)),
        *("--gc-objects", str(args.gc_objects), "--gc-every", str(args.gc_every)),
    ]
    job = OursJob(job_args, tmp / "run", args.work, workload_args, env=env, local=local)
    result: dict = {
        "bench": "false_alarm",
        "placement": args.placement,
        "workers": WORKERS,
        "duration_s": args.duration,
        "workload": workload,
        "elastic_run_args": job_args,
    }
    begin = end = time.time()
    loads: list[tuple[float, float]] = []  # (time, load average) while training, every 0.5 s
    try:
        job.start()
        wait_for(lambda: job.steady(WORKERS, 1), STEADY_DEADLINE, "the first round of 4")
        begin = time.time()
        stop_at = time.monotonic() + args.duration

        def over() -> bool:
            job.check_running()  # a job that ended early ends the wait at once
            loads.append((time.time(), os.getloadavg()[0]))
            return time.monotonic() >= stop_at

        wait_until(
            over,
            args.duration + END_GRACE,
            "the end of the run",
            interval=0.5,
            error=BenchTimeout,
        )
        end = time.time()
        result["job_exit"] = job.finish()
    except BenchTimeout as exc:
        end = time.time()
        result["error"] = str(exc)
    finally:
        job.stop()
        if hosts is not None:
            reap(hosts[0], hosts[1])
    job.log.poll()
    events = job.run.events()
    result.update(count_events(events))
    lost = [e["t"] for e in losses(events)]
    result["loss_times_s"] = [round(t - begin, 1) for t in lost]
    result["load_avg_at_losses"] = loads_at(loads, lost)
    result.update(training_stats(job.log.records, begin, end))
    values = [load for _, load in loads]
    result["load_avg_median"] = round(statistics.median(values), 2) if values else None
    result["load_avg_max"] = round(max(values), 2) if values else None
    result["load_avg"] = round(os.getloadavg()[0], 2)
    return result


@contextlib.contextmanager
def placed_hosts(placement: str, tmp: Path) -> Iterator[NetnsHosts | None]:
    """Two test hosts for ``test-hosts`` (torn down after), None for ``local``."""
    if placement == "local":
        yield None
        return
    with running_hosts(HOSTS, tmp / "hosts") as hosts:
        hosts.quick_resolver()
        yield hosts


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Prints one JSON line. --placement test-hosts needs root.",
    )
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of training under load")
    ap.add_argument(
        "--placement",
        choices=("test-hosts", "local"),
        default="test-hosts",
        help="2 workers on each of 2 test hosts over ssh (default), or 4 on this machine",
    )
    ap.add_argument("--work", type=int, default=400, help="side of the matrix product of each step")
    ap.add_argument(
        "--python-loop",
        type=int,
        default=100_000,
        help="iterations of the pure-Python loop of each step",
    )
    ap.add_argument(
        "--gc-objects",
        type=int,
        default=5_000_000,
        help="live linked objects each worker's forced collection walks",
    )
    ap.add_argument(
        "--gc-every", type=int, default=40, help="steps between forced collections (0: none)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the job's logs (path on stderr)")
    args = ap.parse_args()
    if args.duration <= 0:
        ap.error("--duration must be positive")
    if args.work < 1:
        ap.error("--work must be at least 1")
    for name in ("python_loop", "gc_objects", "gc_every"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must not be negative")
    if args.placement == "test-hosts":
        require_root("false_alarm_run")
    with bench_workdir("false-alarm-", args.keep) as tmp:
        try:
            with placed_hosts(args.placement, tmp) as hosts:
                print(json.dumps(run(args, tmp, hosts)), flush=True)
        except HostsError as exc:
            sys.exit(f"false_alarm_run: cannot make the test hosts: {exc}")


if __name__ == "__main__":
    main()
