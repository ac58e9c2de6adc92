"""The job's main loop in restart mode (``--restart-workers``) with fake worker
processes and a real embedded store: a world started, ended by a failure, restarted
whole; a host whose workers cannot start left out. (Real processes running a torchrun
script: tests/system/jobs/test_restart_workers.py.)"""

from __future__ import annotations

import pytest

from driver.config import parse_args
from driver.job.loop import Job
from rendezvous.schema.rounds import Plan
from tests.driver.job.test_loop import Events, FakeClock, FakeLauncher, FakeProcess, turn_until
from tests.support.jobs import wait_until


@pytest.fixture
def restart_job():
    made: list[Job] = []

    def make(*args: str, launcher: FakeLauncher | None = None):
        launcher = launcher or FakeLauncher()
        events = Events()
        config = parse_args(["--restart-workers", *args, "python", "train.py"])
        job = Job(config, launcher=launcher, events=events, clock=FakeClock())
        made.append(job)
        job.open()
        return job, launcher, events

    yield make
    for job in made:
        job.close()


def running(launcher: FakeLauncher) -> list[FakeProcess]:
    return [p for p in launcher.processes if p.code is None]


def published(job: Job) -> Plan:
    assert job.store is not None
    kv = job.store.get(job.keys.round)
    assert kv is not None
    return Plan.from_json(kv.value)


def test_a_failed_worker_restarts_the_whole_world_with_the_restart_counted(restart_job):
    job, launcher, events = restart_job("-np", "2")
    assert job.store is not None
    stale = job.keys.world_master(1)
    job.store.put(stale, b"{}")  # an earlier run's rank 0 must never be met
    turn_until(job, lambda: len(launcher.processes) == 2, "world 1")
    first = list(launcher.processes)
    assert [p.spec.env["RANK"] for p in first] == ["0", "1"]
    assert {p.spec.env["TORCHELASTIC_RESTART_COUNT"] for p in first} == {"0"}
    assert first[0].spec.command[1:4] == ("-m", "driver.programs.world_entry", "--")
    assert job.store.get(stale) is None
    assert published(job).worker_ids == job.plan.worker_ids and job.plan.round_id == 1
    assert [p.rank for p in first] == [0, 1]  # output prefixes

    first[1].exit(1)
    turn_until(job, lambda: len(launcher.processes) == 4, "world 2")
    assert first[0].code == -15  # stopped (SIGTERM), not left to hang in a collective
    second = launcher.processes[2:]
    assert {p.spec.env["TORCHELASTIC_RESTART_COUNT"] for p in second} == {"1"}
    assert {p.spec.env["ELASTIC_WORLD"] for p in second} == {"2"}
    stopping = next(e for e in events if e.kind == "world_stopping")
    assert stopping.failure and "exit 1" in stopping.reason
    started = [e for e in events if e.kind == "world_started"]
    assert [(e.world, e.restarts, e.size) for e in started] == [(1, 0, 2), (2, 1, 2)]

    for proc in second:
        proc.exit(0)
    wait_until(lambda: job.turn(max_wait=0.02) == 0, 10, "the job's end")
    done = events[-1]
    assert done.kind == "job_done" and done.world and (done.round, done.resets) == (2, 1)
    assert str(done) == "job done in world 2 (2 workers, 1 restart)"


def test_a_worker_that_exits_0_waits_for_the_others(restart_job):
    job, launcher, _ = restart_job("-np", "2")
    turn_until(job, lambda: len(launcher.processes) == 2, "world 1")
    launcher.processes[0].exit(0)
    for _ in range(20):
        assert job.turn(max_wait=0.01) is None
    assert len(launcher.processes) == 2 and launcher.processes[1].code is None
    launcher.processes[1].exit(0)
    wait_until(lambda: job.turn(max_wait=0.02) == 0, 10, "the job's end")


def test_a_host_whose_workers_cannot_start_is_left_out(restart_job):
    """Every start on b fails: each failed world counts against b, which is
    blacklisted, and the next world runs on a alone (--min-np 1)."""
    launcher = FakeLauncher(fail_hosts={"b"})
    job, _, events = restart_job("-np", "2", "--min-np", "1", "-H", "a:1,b:1", launcher=launcher)

    def on_a_alone() -> bool:
        return any(p.spec.env["WORLD_SIZE"] == "1" for p in running(launcher))

    turn_until(job, on_a_alone, "a world on a alone")
    assert all(p.code == -15 for p in launcher.processes if p.spec.env["WORLD_SIZE"] == "2")
    assert any(e.kind == "host_blacklisted" and e.host == "b" for e in events)
    (alone,) = running(launcher)
    assert alone.spec.host == "a" and alone.spec.env["RANK"] == "0"
    assert int(alone.spec.env["TORCHELASTIC_RESTART_COUNT"]) >= 1
