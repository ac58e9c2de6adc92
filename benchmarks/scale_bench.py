"""Scaling latency of ours: host discovery output changes, and a worker's SIGKILL, to the
new world's first collective.

``elastic-run --host-discovery-script`` runs a script that cats a hosts file; the
benchmark rewrites that file (temp file + rename, so the script never reads half of it)
and takes t0 = ``time.time()`` right after the rename, when the new list is what the
script prints. Training is ``workloads/steps.py`` (one allreduce + commit per step;
every commit's wall-clock time is logged with its round and round size).

* ``grow`` (2 -> 4): ``localhost:2`` becomes ``localhost:2`` + ``127.0.0.1:2``
  (``--launcher local``: both are this machine); ``shrink`` (4 -> 2): back to
  ``localhost:2`` (the driver stops the two workers of ``127.0.0.1``). The job
  alternates grow and shrink ``--repeats`` times. That is layout ``hosts``; layout
  ``slots`` grows the host itself (``localhost:2`` becomes ``localhost:4``, and back),
  and ``slots-spares`` does that with ``--spares 2``: the two new slots go to the
  host's warm spares (two new spares start behind them; each change waits for them to
  be ready, so every grow finds two). Spares serve their own host, so a new host gets
  none: layout ``hosts`` shows the fresh-process figure. The time is until every member of
  the first round of the new size formed after t0 has committed a step in a round of
  that size (the new world's first collective: each step is one allreduce, then the
  commit).
* ``sigkill`` (4 -> 3): a separate job on ``localhost:4`` from the same kind of script,
  ``--min-np 2``; t0 just before SIGKILL of a random member of a steady round of 4;
  the time is until every survivor has committed a step in a round newer than the one
  of the kill. One host on purpose: three failures on one host within a minute
  blacklist it, and the driver never blacklists the last host it needs for
  ``--min-np``, so every kill hits a world of 4 (the replacement joins between kills).

The discovery poll interval (``--discovery-interval``, reported as
``discovery_interval``) bounds the part of the latency before the driver sees the
change. Also reported, as medians: ``noticed_s`` (t0 to the driver's ``host_added`` /
``host_removed`` / ``host_slots_changed`` event, or to ``worker_failed`` for a kill),
``round_formed_s`` (t0 to the ``round_formed`` event of the round measured; for a
kill, of the next round) and for ``grow`` the new workers' start, t0 until the last of
them was ``new_worker_spawned_s`` (the driver's ``worker_started``), ``..._start_s``
(its interpreter reached the script), ``..._init_s`` (numpy and elastic imported,
calling ``elastic.init()``) and ``..._joined_s`` (``init()`` returned); for a grow by
spares, ``spares_promoted_s`` (t0 to the last ``spare_promoted``) instead.

One JSON line per configuration on stdout (nothing else):
    {"bench": "scale", "change": "grow"|"shrink"|"sigkill", "layout": "hosts"|"slots"|
     "slots-spares" (grow and shrink), "spares", "from", "to", "median_s", "p90_s",
     "max_s", "samples", "discovery_interval", "noticed_s", "round_formed_s",
     "definition", "job_exit", "load_avg"[, "error"]}

    python -m benchmarks.scale_bench [--repeats 5] [--discovery-interval 0.2]
        [--layouts hosts slots slots-spares]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import time
from pathlib import Path

from benchmarks.harness.ours import OursJob, fresh_worker_phases, phase_medians
from benchmarks.harness.stats import median_or_none, summary
from benchmarks.harness.waits import RECOVERY_DEADLINE, STEADY_DEADLINE, BenchTimeout, wait_for
from benchmarks.harness.workdir import bench_workdir

SHRINK_HOSTS = "localhost:2\n"
#: layout -> (the hosts file of the grown world, spares per host)
LAYOUTS = {
    "hosts": ("localhost:2\n127.0.0.1:2\n", 0),
    "slots": ("localhost:4\n", 0),
    "slots-spares": ("localhost:4\n", 2),
}
HOST_EVENTS = ("host_added", "host_removed", "host_slots_changed")

DEFINITIONS = {
    "grow": "hosts file rewritten -> every member of the first round of the new size "
    "formed after the write has committed a step in a round of that size",
    "shrink": "hosts file rewritten -> every member of the first round of the new size "
    "formed after the write has committed a step in a round of that size",
    "sigkill": "SIGKILL -> every survivor has committed a step in a round newer than the "
    "kill round",
}


def write_hosts(path: Path, text: str) -> float:
    """Replace the hosts file atomically; the time the new content became visible."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return time.time()


def discovery_job(workdir: Path, hosts_text: str, args: list[str], work: int) -> tuple:
    workdir.mkdir(parents=True)
    hosts = workdir / "hosts.txt"
    hosts.write_text(hosts_text)
    script = workdir / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    job = OursJob(
        ["--host-discovery-script", str(script), "--launcher", "local", *args], workdir, work
    )
    return job, hosts


def measure_change(
    job: OursJob, hosts: Path, text: str, size: int, settle: int, spares: int
) -> tuple[float, float | None, float, dict | None]:
    """Rewrite the hosts file once the world is steady (and ``spares`` spares are
    ready); (latency, noticed, formed, the fresh workers' phases or the promotions)."""
    before = wait_for(
        lambda: job.steady(size_before(size), settle, spares),
        STEADY_DEADLINE,
        f"a steady round of {size_before(size)}",
    )
    t0 = write_hosts(hosts, text)

    def changed():
        job.check_running()
        job.log.poll()
        new = next(
            (r for r in job.rounds() if r["round"] > before["round"] and r["size"] == size), None
        )
        if new is None:
            return None
        times = [
            job.log.first_commit_after(m, new["round"] - 1, t0, size=size) for m in new["members"]
        ]
        return None if None in times else (max(times), new)

    done, new = wait_for(changed, RECOVERY_DEADLINE, f"a world of {size} after the change")
    noticed = next(
        (e["t"] for e in job.run.events() if e["kind"] in HOST_EVENTS and e["t"] >= t0), None
    )
    fresh = set(new["members"]) - set(before["members"])
    promoted = [e["t"] - t0 for e in job.run.events("spare_promoted") if e["worker"] in fresh]
    phases: dict | None
    if promoted:
        phases = {"promoted": max(promoted)} if len(promoted) == len(fresh) else None
    else:
        phases = fresh_worker_phases(job, fresh, t0) if fresh else None
    return done - t0, (noticed - t0 if noticed else None), new["t"] - t0, phases


def size_before(size_after: int) -> int:
    return 2 if size_after == 4 else 4


def result_line(
    change: str, frm: int, to: int | None, samples, noticed, formed, interval, extra: dict, fresh=()
) -> dict:
    fresh = [p for p in fresh if p]
    by_spares = [p["promoted"] for p in fresh if "promoted" in p]
    return {
        "bench": "scale",
        "change": change,
        "from": frm,
        "to": to,
        **summary(samples),
        "discovery_interval": interval,
        "noticed_s": median_or_none(noticed),
        "round_formed_s": median_or_none(formed),
        **phase_medians([p for p in fresh if "promoted" not in p], "new_worker_"),
        **({"spares_promoted_s": median_or_none(by_spares)} if by_spares else {}),
        "definition": DEFINITIONS[change],
        **extra,
        "load_avg": round(os.getloadavg()[0], 2),
    }


def grow_shrink(
    layout: str, repeats: int, interval: float, settle: int, work: int, tmp: Path
) -> list[dict]:
    grown, spares = LAYOUTS[layout]
    args = ["-np", "2", "--min-np", "2", "--discovery-interval", str(interval)]
    if spares:
        args += ["--spares", str(spares)]
    job, hosts = discovery_job(tmp / f"grow-shrink-{layout}", SHRINK_HOSTS, args, work)
    grow: tuple[list, list, list, list] = ([], [], [], [])
    shrink: tuple[list, list, list, list] = ([], [], [], [])
    extra: dict = {"layout": layout, "spares": spares, "elastic_run_args": args}
    try:
        job.start()
        for _ in range(repeats):
            for out, text, size in ((grow, grown, 4), (shrink, SHRINK_HOSTS, 2)):
                for series, value in zip(
                    out, measure_change(job, hosts, text, size, settle, spares)
                ):
                    series.append(value)
        extra["job_exit"] = job.finish()
    except BenchTimeout as exc:
        extra["error"] = str(exc)
    finally:
        job.stop()
    return [
        result_line("grow", 2, 4, *grow[:3], interval, extra, grow[3]),
        result_line("shrink", 4, 2, *shrink[:3], interval, extra),
    ]


def sigkills(
    kills: int, interval: float, settle: int, work: int, rng: random.Random, tmp: Path
) -> dict:
    job, _ = discovery_job(
        tmp / "sigkill",
        "localhost:4\n",
        ["-np", "4", "--min-np", "2", "--discovery-interval", str(interval)],
        work,
    )
    samples, noticed, formed, sizes = [], [], [], []
    extra = {}
    try:
        job.start()
        for _ in range(kills):
            current = wait_for(
                lambda: job.steady(4, settle), STEADY_DEADLINE, "a steady round of 4"
            )
            round_id, members = current["round"], current["members"]
            victim = rng.choice(members)
            survivors = [m for m in members if m != victim]
            pid = job.run.worker_pids()[victim]
            t0 = time.time()
            os.kill(pid, signal.SIGKILL)

            def recovered(survivors=survivors, round_id=round_id, t0=t0):
                job.check_running()
                job.log.poll()
                times = [job.log.first_commit_after(m, round_id, t0) for m in survivors]
                return None if None in times else max(times)

            samples.append(
                wait_for(recovered, RECOVERY_DEADLINE, f"recovery from killing {victim}") - t0
            )
            failed = next(
                (e for e in job.run.events("worker_failed") if e["worker"] == victim), None
            )
            noticed.append(failed["t"] - t0 if failed else None)
            nxt = next((r for r in job.rounds() if r["round"] > round_id), None)
            formed.append(nxt["t"] - t0 if nxt else None)
            sizes.append(nxt["size"] if nxt else None)
        extra["job_exit"] = job.finish()
    except BenchTimeout as exc:
        extra["error"] = str(exc)
    finally:
        job.stop()
    to = max(set(sizes), key=sizes.count) if sizes else 3
    return result_line("sigkill", 4, to, samples, noticed, formed, interval, extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="grow/shrink cycles, and SIGKILLs")
    ap.add_argument("--discovery-interval", type=float, default=0.2)
    ap.add_argument(
        "--changes",
        nargs="+",
        default=["grow-shrink", "sigkill"],
        choices=["grow-shrink", "sigkill"],
    )
    ap.add_argument(
        "--layouts",
        nargs="+",
        default=list(LAYOUTS),
        choices=list(LAYOUTS),
        help="how grow-shrink grows (see the module docstring)",
    )
    ap.add_argument(
        "--settle-steps",
        type=int,
        default=20,
        help="commits every member makes in a round before the next change",
    )
    ap.add_argument(
        "--work", type=int, default=160, help="side of the matrix product each step computes"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the jobs' logs (path on stderr)")
    args = ap.parse_args()
    with bench_workdir("scale-bench-", args.keep) as tmp:
        if "grow-shrink" in args.changes:
            for layout in args.layouts:
                for line in grow_shrink(
                    layout, args.repeats, args.discovery_interval, args.settle_steps, args.work, tmp
                ):
                    print(json.dumps(line), flush=True)
        if "sigkill" in args.changes:
            print(
                json.dumps(
                    sigkills(
                        args.repeats,
                        args.discovery_interval,
                        args.settle_steps,
                        args.work,
                        random.Random(args.seed),
                        tmp,
                    )
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
