"""The job's main loop (``driver.job.loop.Job``) with fake worker processes, a fake clock
and a real embedded store: launches, registrations, rounds, exits, timers and the end of
a job, driven turn by turn. (Real processes and real signals:
tests/system/jobs/test_driver_jobs.py.)"""

from __future__ import annotations

import itertools
import signal
import threading
import time

import pytest

from driver.config import parse_args
from driver.errors import JobFailed, JobStopped, LaunchError
from driver.job.loop import Job
from driver.job.messages import (
    ChaosTick,
    FailureReport,
    ProgressReported,
    RegistryResync,
    SignalReceived,
    changes_nothing,
)
from driver.job.wiring import JobWiring, WorkerSeat, job_env, worker_env
from driver.launch.base import Launcher
from driver.policy import lifecycle, spares
from driver.policy.lifecycle import WorkerRecord, WorkerState
from rendezvous.schema.rounds import Plan
from rendezvous.schema.workers import FailureRecord, ProgressRecord, WorkerInfo
from rendezvous.store import DELETE, PUT, Event, KeyValue, KVStore
from tests.support.jobs import wait_until

_pids = itertools.count(40000)


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeProcess:
    """Stands in for a worker process: it exits when the test (or a kill) says so."""

    def __init__(self, spec):
        self.spec = spec
        self.pid = next(_pids)
        self.rank = None
        self.code: int | None = None
        self.killed = False
        self._exited = threading.Event()

    def exit(self, code: int) -> None:
        if self.code is None:
            self.code = code
        self._exited.set()

    def wait(self, timeout):
        self._exited.wait(timeout)
        return self.code

    def kill(self) -> None:
        self.killed = True
        self.exit(-9)

    def stop(self, grace: float = 0.0):
        self.exit(-15)
        return self.code


class FakeLauncher(Launcher):
    name = "fake"

    def __init__(self, fail_hosts=()):
        super().__init__()
        self.processes: list[FakeProcess] = []
        self.fail_hosts = set(fail_hosts)

    def launch(self, spec, prefix=None):
        if spec.host in self.fail_hosts:
            raise LaunchError(f"cannot start {spec.command[0]!r} for {spec.label}")
        proc = FakeProcess(spec)
        self.processes.append(proc)
        return proc

    def by_worker(self, worker_id: str) -> FakeProcess:
        return next(p for p in self.processes if p.spec.env["ELASTIC_WORKER_ID"] == worker_id)


class Events(list):
    def emit(self, event):
        self.append(event)
        return event

    def kinds(self) -> list[str]:
        return [e.kind for e in self]


@pytest.fixture
def harness():
    made = []

    def make(*args: str, launcher: FakeLauncher | None = None):
        clock = FakeClock()
        launcher = launcher or FakeLauncher()
        events = Events()
        job = Job(
            parse_args([*args, "python", "train.py"]), launcher=launcher, events=events, clock=clock
        )
        made.append(job)
        job.open()
        return job, launcher, events, clock

    yield make
    for job in made:
        job.close()


def turn_until(job: Job, condition, what: str, timeout: float = 10.0):
    """Turn the loop until ``condition()`` holds (store watches deliver asynchronously)."""

    def step():
        job.turn(max_wait=0.02)
        return condition()

    return wait_until(step, timeout, what, interval=0)


def store_of(job: Job) -> KVStore:
    assert job.store is not None
    return job.store


def register(job: Job, worker_id: str) -> None:
    """What a worker does once it has started: write its registration."""
    rec = job.workers[worker_id]
    info = WorkerInfo(worker_id, rec.host, rec.slot, 1, f"127.0.0.1:{7000 + rec.slot}")
    store_of(job).put(job.keys.worker(worker_id), info.to_json())


def published(job: Job) -> Plan | None:
    kv = store_of(job).get(job.keys.round)
    return Plan.from_json(kv.value) if kv is not None else None


def first_round(job: Job, size: int) -> list[str]:
    turn_until(job, lambda: len(job.workers) == size, f"{size} launches")
    for worker_id in job.workers:
        register(job, worker_id)
    turn_until(job, lambda: job.plan is not None, "round 1")
    return list(job.workers)


# ----------------------------------------------------------------------------- whole jobs


def test_a_job_forms_its_round_and_succeeds(harness):
    job, launcher, events, _ = harness("-np", "2")
    ids = first_round(job, 2)
    assert published(job) == job.plan and job.plan.worker_ids == tuple(ids)
    assert [p.rank for p in launcher.processes] == [0, 1]
    for proc in launcher.processes:
        proc.exit(0)
    wait_until(lambda: job.turn(max_wait=0.02) == 0, 10, "the job's end")
    assert events.kinds()[-3:] == ["worker_exited", "worker_exited", "job_done"]
    assert events[-1].round == 1 and events[-1].size == 2 and events[-1].resets == 0


def test_run_returns_the_exit_status(tmp_path):
    launcher = FakeLauncher()
    job = Job(
        parse_args(["-np", "1", "python", "train.py"]),
        launcher=launcher,
        events=Events(),
        clock=FakeClock(),
    )
    result: list = []
    runner = threading.Thread(target=lambda: result.append(job.run()), daemon=True)
    runner.start()
    wait_until(lambda: job.workers, 10, "a launch")
    (worker_id,) = job.workers
    register(job, worker_id)
    wait_until(lambda: job.plan is not None, 10, "round 1")
    launcher.processes[0].exit(0)
    runner.join(10)
    assert result == [0]


def test_a_failed_member_is_replaced_and_the_round_re_forms(harness):
    job, launcher, events, clock = harness("-np", "2")
    a, b = first_round(job, 2)
    clock.advance(5)
    launcher.by_worker(b).exit(1)
    turn_until(job, lambda: len(job.workers) == 3, "a replacement")
    assert job.workers[b].state is WorkerState.FAILED
    failed = next(e for e in events if e.kind == "worker_failed")
    assert failed.worker == b and failed.code == 1 and failed.in_round and not failed.chaos
    (c,) = set(job.workers) - {a, b}
    assert (job.workers[c].host, job.workers[c].slot) == (job.workers[b].host, 1)
    register(job, c)
    turn_until(job, lambda: job.plan is not None and job.plan.round_id == 2, "round 2")
    assert job.plan == published(job) and job.plan.worker_ids == (a, c)
    assert job.book.rounds.resets == 1


def test_start_timeout_on_the_fake_clock(harness):
    job, _, _, clock = harness("-np", "2", "--start-timeout", "30")
    turn_until(job, lambda: len(job.workers) == 2, "launches")
    clock.advance(31)
    with pytest.raises(JobFailed, match="only 0 of 2 workers registered within --start-timeout"):
        job.turn(max_wait=0.02)


def test_a_lapsed_registration_is_killed_after_the_grace(harness):
    job, launcher, _, clock = harness("-np", "2", "--min-np", "1")
    _, b = first_round(job, 2)
    store_of(job).delete(job.keys.worker(b))  # its lease expired; the process still runs
    turn_until(job, lambda: job.workers[b].state is WorkerState.UNREGISTERED, "the lapse")
    clock.advance(9)
    job.turn(max_wait=0.02)
    assert not launcher.by_worker(b).killed
    clock.advance(2)
    turn_until(job, lambda: launcher.by_worker(b).killed, "the kill")


def test_chaos_kills_a_member_that_does_not_count_against_its_host(harness):
    job, launcher, events, _ = harness("-np", "2", "--chaos-kill-interval", "600")
    first_round(job, 2)
    job.post(ChaosTick())
    turn_until(job, lambda: "chaos_kill" in events.kinds(), "the chaos kill")
    kill = next(e for e in events if e.kind == "chaos_kill")
    assert launcher.by_worker(kill.worker).killed and kill.kill == 1
    turn_until(job, lambda: any(e.kind == "worker_failed" for e in events), "the exit")
    assert next(e for e in events if e.kind == "worker_failed").chaos
    assert job.book.failures.streak == 0


def test_a_launch_failure_is_a_failure_of_its_host(harness):
    job, _, events, _ = harness(
        "-np",
        "1",
        "-H",
        "localhost:1,nohost:1",
        "--min-np",
        "1",
        "--launcher",
        "local",
        launcher=FakeLauncher(fail_hosts={"nohost"}),
    )
    turn_until(job, lambda: "worker_failed" in events.kinds(), "the failed launch")
    failed = next(e for e in events if e.kind == "worker_failed")
    assert failed.host == "nohost" and failed.code is None
    assert failed.reason.startswith("launch failed: cannot start 'python'")


def test_a_signal_ends_the_job_with_its_name(harness):
    """Without a checkpoint directory a signal stops the job at once: a stop, not a
    failure (``elastic-run`` exits 128 + the signal), saying the state is not kept."""
    job, _, events, _ = harness("-np", "1")
    job.post(SignalReceived(signal.SIGTERM))
    with pytest.raises(JobStopped, match="stopped by SIGTERM") as stopped:
        job.turn(max_wait=0.02)
    assert stopped.value.signum == signal.SIGTERM and "--checkpoint-dir" in str(stopped.value)
    assert [e.kind for e in events if e.kind in ("job_stopped", "job_failed")] == ["job_stopped"]


def spares_of(job: Job) -> list[str]:
    return [w for w, r in job.workers.items() if r.spare and r.state.running]


def with_a_ready_spare(job: Job) -> tuple[str, str, str]:
    """The first round of two, then its spare (started once the round formed), registered."""
    first_round(job, 2)
    assert job.plan is not None
    a, b = job.plan.worker_ids
    turn_until(job, lambda: spares_of(job), "the spare")
    (s,) = spares_of(job)
    register(job, s)
    turn_until(job, lambda: job.workers[s].ready_spare, "the spare's registration")
    return a, b, s


def test_a_spare_takes_a_failed_members_slot_and_is_refilled_later(harness):
    job, launcher, events, clock = harness("-np", "2", "--spares", "1")
    a, b, s = with_a_ready_spare(job)
    assert job.workers[s].spare and job.plan.worker_ids == (a, b)
    assert launcher.by_worker(s).spec.env["ELASTIC_SPARE"] == "1"
    assert "ELASTIC_SPARE" not in launcher.by_worker(a).spec.env
    assert launcher.by_worker(s).spec.label == "localhost#0"
    assert "spare_ready" in events.kinds()
    clock.advance(5)
    launcher.by_worker(b).exit(-9)
    turn_until(job, lambda: job.plan.round_id == 2, "round 2")
    assert job.plan.worker_ids == (a, s) and job.plan.member(s).slot == 1
    assert published(job) == job.plan and job.book.rounds.resets == 1
    promoted = next(e for e in events if e.kind == "spare_promoted")
    assert (promoted.worker, promoted.slot) == (s, 1)
    # Nothing was started for the slot; the new spare waits for the refill delay.
    assert len(job.workers) == 3 and not spares_of(job)
    clock.advance(spares.SPARE_REFILL_DELAY + 0.1)
    turn_until(job, lambda: spares_of(job), "the new spare")
    (new,) = spares_of(job)
    assert job.workers[new].slot == 0 and job.plan.worker_ids == (a, s)


def test_a_spare_dying_idle_is_replaced_without_a_round(harness):
    job, launcher, events, _ = harness("-np", "2", "--spares", "1")
    a, b, s = with_a_ready_spare(job)
    launcher.by_worker(s).exit(-9)
    turn_until(job, lambda: spares_of(job), "the new spare")
    assert job.plan.round_id == 1 and job.plan.worker_ids == (a, b)
    assert job.book.failures.streak == 0 and job.book.rounds.change_at is None
    assert "worker_failed" not in events.kinds()
    lost = next(e for e in events if e.kind == "spare_lost")
    assert lost.worker == s and lost.registered


# ----------------------------------------------------------------------------- bookkeeping


def _job_with(*worker_ids):
    job = Job(
        parse_args(["-np", str(max(1, len(worker_ids))), "python", "x.py"]),
        launcher=FakeLauncher(),
        events=Events(),
        clock=FakeClock(),
    )
    for i, wid in enumerate(worker_ids):
        job.workers[wid] = WorkerRecord.launched(wid, "localhost", i, 0.0)
    return job


def _kv(job, wid, revision):
    info = WorkerInfo(wid, "localhost", 0, 1, "127.0.0.1:1")
    return KeyValue(job.keys.worker(wid), info.to_json(), revision, revision, 1)


def test_registry_resync_registers_and_unregisters():
    job = _job_with("a", "b", "c")
    job.workers["b"] = lifecycle.registered(
        job.workers["b"], WorkerInfo("b", "localhost", 1, 1, "x:1"), 1, 0.0
    )
    job._messages.on_registry_resync(RegistryResync([_kv(job, "a", 5), _kv(job, "c", 6)]))
    assert job.workers["a"].info is not None and job.workers["c"].info is not None
    assert job.workers["b"].info is None and job.workers["b"].state is WorkerState.UNREGISTERED
    assert job.workers["a"].registered_seq < job.workers["c"].registered_seq


def test_worker_env_carries_the_job_and_the_worker():
    job = _job_with()
    wiring = JobWiring(job.config, "s3cret", "embedded://h:1")
    env = worker_env(wiring, WorkerSeat("w-1", "h", 2, "127.0.0.1"))
    assert env["ELASTIC_JOB_SECRET"] == "s3cret" and env["ELASTIC_WORKER_ID"] == "w-1"
    assert env["ELASTIC_SLOT"] == "2" and env["ELASTIC_RENDEZVOUS"] == "embedded://h:1"
    assert set(job_env(job.config, "s3cret", "u")) <= set(env)


def test_a_signal_ends_the_wait_for_the_ps_shards_at_once():
    """The fake shards never serve; SIGTERM (a message to the loop) still ends open()
    long before the start timeout. (A real clock: the supervisor's own wait ends, in its
    thread, after the timeout.)"""
    job = Job(
        parse_args(["-np", "1", "--num-ps", "1", "--start-timeout", "8", "python", "x.py"]),
        launcher=FakeLauncher(),
        events=Events(),
    )
    timer = threading.Timer(0.3, job.post, (SignalReceived(signal.SIGTERM),))
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(JobStopped, match="stopped by SIGTERM while the ps shards started"):
            job.open()
        assert time.monotonic() - started < 4
    finally:
        timer.cancel()
        job.close()


def test_reports_about_a_round_the_job_has_left_turn_no_rules(harness, monkeypatch):
    """A round of thousands ends with a report from every survivor, mostly after the
    next round is out: those, and the reports' deletions, run no turn of the rules (each
    turn reads every worker); nor do those of the current round that accuse nobody (a
    crash's: its process exit says it), while one that accuses a member does."""
    job, _, events, _ = harness("-np", "2")
    a, b = first_round(job, 2)
    turns: list[int] = []
    reconcile = job._reconcile

    def counted() -> None:
        turns.append(1)
        reconcile()

    monkeypatch.setattr(job, "_reconcile", counted)

    def report(
        round_id: int, reporter: str, kind: str = PUT, suspect: str | None = None
    ) -> FailureReport:
        record = FailureRecord(reporter, round_id, "peer lost", suspect).to_json()
        key = job.keys.failure(round_id, reporter)
        return FailureReport.from_event(Event(kind, KeyValue(key, record, 1, 1, 1)))

    job.turn(max_wait=0.02)  # a wake-up: the next turn runs the rules
    job.post(report(job.plan.round_id - 1, "first"))
    job.turn(max_wait=10.0)
    turns.clear()
    for i in range(100):  # one by one, as they arrive: a turn each
        job.post(report(job.plan.round_id - 1, f"old{i}"))
        job.turn(max_wait=10.0)
        job.post(report(job.plan.round_id, f"gone{i}", DELETE))
        job.turn(max_wait=10.0)
    assert turns == []
    assert sum(1 for e in events if e.kind == "failure_reported") >= 100  # each still said
    job.post(report(job.plan.round_id, a))  # accuses nobody: no turn asked for...
    job.turn(max_wait=10.0)
    job.post(report(job.plan.round_id, a, suspect=b))  # ... this one asks for one
    job.turn(max_wait=10.0)
    job.turn(max_wait=0.0)
    assert turns == [1]


def test_rank_0s_first_step_is_said_at_once_and_the_rest_turn_no_rules(harness, monkeypatch):
    """Rank 0 rewrites its step every second: its first record is said at once (a job
    of a few seconds says one), the ones after it run no turn of the rules each (the
    progress rule wakes itself for its next line), and that line, an interval on, says
    the newest step and the rate between the records at the interval's ends."""
    job, _, events, clock = harness("-np", "2", "--progress-interval", "10")
    first_round(job, 2)
    turns: list[int] = []
    reconcile = job._reconcile

    def counted() -> None:
        turns.append(1)
        reconcile()

    monkeypatch.setattr(job, "_reconcile", counted)

    def progress(step: int) -> ProgressReported:
        assert job.plan is not None
        return ProgressReported(ProgressRecord(step, job.plan.round_id, "w").to_json())

    job.turn(max_wait=0.02)  # a wake-up: the next turn runs the rules
    start = clock.now
    for step in (3, 23):  # the turn after the first record says it
        job.post(progress(step))
        job.turn(max_wait=10.0)
    said = [e for e in events if e.kind == "progress"]
    assert [(e.step, e.steps_per_second) for e in said] == [(3, None)]
    turns.clear()
    clock.now = start + 0.5  # (before any wake-up of the rules' own)
    for step in range(43, 203, 20):  # one by one, as they arrive
        job.post(progress(step))
        job.turn(max_wait=10.0)
    job.turn(max_wait=0.0)  # (a turn here: the last record asked for one)
    assert turns == [] and job.book.progress.step == 183
    clock.now = start + 8.0
    job.post(progress(203))
    job.turn(max_wait=10.0)
    clock.now = start + 10.0
    job.turn(max_wait=0.0)
    said = [e for e in events if e.kind == "progress"]
    assert [(e.step, e.steps_per_second) for e in said] == [(3, None), (203, 25.0)]


def test_an_unreadable_failure_report_is_ignored_and_the_job_goes_on(harness, caplog):
    """A report the codec refuses (a field of the wrong type, or not JSON at all) is
    logged and dropped on the watch's side: no turn of the rules, no event, no crash."""
    job, _, events, _ = harness("-np", "2")
    first_round(job, 2)
    key = job.keys.failure(job.plan.round_id, "w")
    for value in (b"not json", b'{"worker_id": 7, "round_id": "x", "reason": null}'):
        message = FailureReport.from_event(Event(PUT, KeyValue(key, value, 1, 1, 1)))
        assert message.record is None and changes_nothing(message, job.plan)
        job.post(message)
        assert job.turn(max_wait=0.05) is None
    assert not [e for e in events if e.kind == "failure_reported"]
    assert "ignoring an unreadable failure report" in caplog.text
