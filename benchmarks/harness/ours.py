"""Our job under measurement: ``elastic-run`` over ``workloads/steps.py``, the workers'
commit log beside it, and the phases of a fresh worker's start."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.harness.commits import CommitLog
from benchmarks.harness.jobs import ElasticRun, pid_alive
from benchmarks.harness.paths import STEPS
from benchmarks.harness.processes import THREAD_ENV, kill_group
from benchmarks.harness.stats import median_or_none
from benchmarks.harness.waits import FINISH_DEADLINE, BenchTimeout

#: the phases of a fresh worker's start, in order (``workloads/steps.py`` records them)
FRESH_PHASES = ("spawned", "start", "init", "joined")


def fresh_worker_phases(job: OursJob, workers, t0: float) -> dict:
    """For the fresh ``workers`` of a re-formed round: seconds from ``t0`` until the last
    of them reached each phase: ``spawned`` (the driver's worker_started event),
    ``start`` (its interpreter reached the script), ``init`` (numpy and elastic imported,
    about to call ``elastic.init()``), ``joined`` (``init()`` returned: registered, in a
    round, ring connected). None for a phase not seen."""
    job.log.poll()
    started = {e["worker"]: e["t"] for e in job.run.events("worker_started")}
    phases = {}
    for phase in FRESH_PHASES:
        if phase == "spawned":
            times = [started.get(w) for w in workers]
        else:
            times = [(job.log.event(w, phase) or {}).get("t") for w in workers]
        known = [t for t in times if t is not None]
        phases[phase] = max(known) - t0 if times and len(known) == len(times) else None
    return phases


def phase_medians(rows: list[dict], prefix: str) -> dict:
    """{prefix + phase + "_s": median over the rows} for the phases in ``rows``."""
    return (
        {
            f"{prefix}{phase}_s": median_or_none([r.get(phase) for r in rows])
            for phase in FRESH_PHASES
        }
        if rows
        else {}
    )


class OursJob:
    """``elastic-run`` running ``workloads/steps.py`` (through ``benchmarks.harness.jobs.ElasticRun``:
    its own process group, events file, and a ``stop()`` that reaps every worker).

    ``workload_args``: more arguments for ``steps.py``; ``env``: more environment for
    ``elastic-run``; ``local``: the workers run on this machine, so the pids they log
    are ours to signal (workers on test hosts log pids of their host's PID namespace:
    whoever made the hosts reaps them)."""

    def __init__(
        self,
        args: list[str],
        workdir: Path,
        work: int,
        workload_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        local: bool = True,
    ):
        self.out = workdir / "out"
        self.out.mkdir(parents=True)
        self.log = CommitLog(self.out)
        self.local = local
        command = [
            *(sys.executable, str(STEPS), str(self.out)),
            *("--work", str(work), *workload_args),
        ]
        self.run = ElasticRun([*args, *command], workdir, env={**THREAD_ENV, **(env or {})})

    def start(self) -> OursJob:
        self.run.start()
        return self

    def rounds(self) -> list[dict]:
        return self.run.events("round_formed")

    def current_round(self):
        rounds = self.rounds()
        return rounds[-1] if rounds else None

    def check_running(self) -> None:
        """BenchTimeout at once if elastic-run ended: no point waiting out a deadline."""
        proc = self.run.proc
        assert proc is not None, "start() first"
        if proc.poll() is not None:
            raise BenchTimeout(
                f"elastic-run exited with {proc.returncode}: " + self.run.stderr_tail(5)
            )

    def ready_spares(self) -> set[str]:
        """The spares registered and neither promoted nor lost yet."""
        events = self.run.events()
        ready = {e["worker"] for e in events if e["kind"] == "spare_ready"}
        gone = {e["worker"] for e in events if e["kind"] in ("spare_promoted", "spare_lost")}
        return ready - gone

    def steady(self, size: int, settle: int, spares: int = 0):
        """The current round event when it has ``size`` members, each with ``settle``
        commits in it and nobody in a newer round, and ``spares`` spares are ready;
        else None."""
        self.check_running()
        if spares and len(self.ready_spares()) < spares:
            return None
        current = self.current_round()
        self.log.poll()
        if current is None or current["size"] != size or self.log.max_round > current["round"]:
            return None
        if all(self.log.count_in_round(m, current["round"]) >= settle for m in current["members"]):
            return current
        return None

    def finish(self) -> int | None:
        """End the job through the stop file; its exit status (None if it had to be
        stopped by signals)."""
        (self.out / "stop").touch()
        try:
            return self.run.wait(timeout=FINISH_DEADLINE)
        except AssertionError:
            return None

    def stop(self) -> None:
        self.run.stop()
        if not self.local:
            return
        # stop() covers the workers the events file names; a worker that started but
        # whose event line was never written cannot exist (the event follows the spawn
        # in the same thread), but the workloads' own start records are checked too.
        self.log.poll()
        for key in list(self.log.records):
            start = self.log.event(key, "start")
            if start and pid_alive(start["pid"]):
                kill_group(start["pid"])
