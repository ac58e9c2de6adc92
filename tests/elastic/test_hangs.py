"""The hang watchdog's parts (``elastic.hangs``): the training clock and its pure rule
(when training is hung, and the adaptive timeout), the stacks it sends, the setting it
reads, and the watchdog thread reporting a stall once, under the registration's lease."""

from __future__ import annotations

import threading
import time

import pytest

from elastic.hangs import watchdog as watchdog_module
from elastic.hangs.clock import (
    ClockView,
    HangSettings,
    TrainingClock,
    hang_after,
    hang_timeout,
    stalled_for,
)
from elastic.hangs.watchdog import Watchdog, settings_from_env, thread_stacks
from rendezvous import env
from rendezvous.errors import RendezvousConfigError
from rendezvous.keys import JobKeys
from rendezvous.schema.workers import FailureRecord
from tests.support.jobs import wait_until


@pytest.mark.unit
@pytest.mark.timeout(10)
def test_the_timeout_adapts_to_the_median_step_above_a_floor_or_is_the_one_given():
    adapt = HangSettings(floor=60.0, factor=5.0)
    assert hang_timeout(adapt, ()) == 60.0  # no step yet: a first step's compile
    assert hang_timeout(adapt, (0.1, 0.2, 30.0)) == 60.0  # 5 x 0.2 s is below the floor
    assert hang_timeout(adapt, (20.0, 20.0, 1.0, 400.0)) == 100.0  # the median, not the mean
    assert hang_timeout(HangSettings(timeout=3.0), (100.0,)) == 3.0  # given: as it is
    off = HangSettings(timeout=0.0)
    assert off.off and hang_timeout(off, (1.0,)) == 0.0
    assert not adapt.off and not HangSettings(timeout=3.0).off


@pytest.mark.unit
@pytest.mark.timeout(10)
def test_only_a_training_outside_every_collective_for_the_timeout_is_hung():
    given = HangSettings(timeout=3.0)
    idle = ClockView(training=True, busy=0, since=100.0)
    assert stalled_for(idle, 102.0) == 2.0 and hang_after(idle, 102.0, given) is None
    assert hang_after(idle, 103.0, given) == 3.0
    # In a collective (waiting for a hung peer), or outside the training function (a
    # round's wait, the script's end): never hung, however long.
    waiting = ClockView(training=True, busy=1, since=100.0)
    outside = ClockView(training=False, busy=0, since=100.0)
    for view in (waiting, outside):
        assert stalled_for(view, 1e6) == 0.0 and hang_after(view, 1e6, given) is None
    assert hang_after(idle, 1e6, HangSettings(timeout=0.0)) is None  # off
    steps = ClockView(training=True, busy=0, since=100.0, steps=(30.0,) * 5)
    assert hang_after(steps, 249.0, HangSettings()) is None  # 5 x 30 s
    assert hang_after(steps, 250.0, HangSettings()) == 150.0


@pytest.mark.unit
@pytest.mark.timeout(10)
def test_the_clock_follows_collectives_commits_and_the_training_function():
    clock = TrainingClock()
    assert not clock.view().training
    clock.start_training()
    view = clock.view()
    assert view.training and view.busy == 0 and view.thread_id == threading.get_ident()
    clock.enter()
    assert clock.view().busy == 1
    clock.leave()
    clock.leave()  # (never below 0)
    assert clock.view().busy == 0
    for _ in range(3):
        clock.enter()
        clock.committed()
    # The first commit after a (re)start ends no step: the gap before it is the sync's.
    assert len(clock.view().steps) == 2
    clock.start_training()  # a re-form: the next commit starts the count again
    clock.enter()
    clock.committed()
    assert len(clock.view().steps) == 2
    before = clock.view().since
    time.sleep(0.01)  # (the clock's own time must move: a real wait, not a condition)
    clock.enter()
    assert clock.view().since > before
    clock.leave()
    clock.stop_training()
    assert not clock.view().training


@pytest.mark.unit
@pytest.mark.timeout(10)
def test_the_setting_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(env.ENV_HANG_TIMEOUT, raising=False)
    assert settings_from_env() == HangSettings()
    monkeypatch.setenv(env.ENV_HANG_TIMEOUT, "")
    assert settings_from_env() == HangSettings()
    monkeypatch.setenv(env.ENV_HANG_TIMEOUT, "2.5")
    assert settings_from_env() == HangSettings(timeout=2.5)
    monkeypatch.setenv(env.ENV_HANG_TIMEOUT, "0")
    assert settings_from_env().off
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv(env.ENV_HANG_TIMEOUT, bad)
        with pytest.raises(RendezvousConfigError, match=env.ENV_HANG_TIMEOUT):
            settings_from_env()


def _stuck_here(entered: threading.Event, release: threading.Event) -> None:
    entered.set()
    release.wait(10)  # THE STUCK LINE


@pytest.mark.unit
@pytest.mark.timeout(10)
def test_the_stacks_hold_every_thread_the_training_thread_first_and_where_it_is():
    entered, release = threading.Event(), threading.Event()
    stuck = threading.Thread(target=_stuck_here, args=(entered, release), name="stuck-one")
    stuck.start()
    try:
        entered.wait(5)
        stacks, where = thread_stacks(stuck.ident)
    finally:
        release.set()
        stuck.join(5)
    assert stacks.startswith("Thread 'stuck-one'") and "the training thread" in stacks
    assert "MainThread" in stacks and "# THE STUCK LINE" in stacks
    assert where.endswith(" in wait")  # the innermost frame: threading's wait
    assert "test_hangs.py" in stacks.split("Thread 'MainThread'")[0]


class FakeStore:
    def __init__(self) -> None:
        self.puts: list[tuple[str, bytes, int]] = []

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        self.puts.append((key, value, lease))


class FakeRuntime:
    keys = JobKeys("j")
    round_id = 4
    lease_id = 77

    def __init__(self) -> None:
        self.store = FakeStore()


@pytest.mark.timeout(20)
def test_the_watchdog_reports_a_stall_once_under_the_lease_and_again_after_progress():
    clock, runtime = TrainingClock(), FakeRuntime()
    watchdog = Watchdog(runtime, "w1", HangSettings(timeout=0.3), clock)  # type: ignore[arg-type]
    watchdog.start()
    try:
        clock.start_training()
        puts = runtime.store.puts
        wait_until(lambda: puts, 5, "a hang report")
        key, value, lease = puts[0]
        report = FailureRecord.from_json(value)
        assert key == JobKeys("j").hung(4, "w1") and lease == 77
        assert report.hung and report.worker_id == report.suspect == "w1"
        assert report.round_id == 4 and "hang timeout 0.3s" in report.reason
        assert "the training thread" in report.stacks
        time.sleep(0.6)  # the same stall, twice its timeout on: no second report (under test)
        assert len(puts) == 1
        clock.enter()  # progress, then a stall again: reported again
        clock.leave()
        wait_until(lambda: len(puts) == 2, 5, "a second hang report")
        clock.enter()  # inside a collective: never reported
        time.sleep(0.6)  # (the absence of a report over twice the timeout is under test)
        assert len(puts) == 2
    finally:
        watchdog.stop()


@pytest.mark.timeout(10)
def test_a_watchdog_turned_off_starts_no_thread():
    watchdog = Watchdog(FakeRuntime(), "w1", HangSettings(timeout=0.0))  # type: ignore[arg-type]
    before = threading.active_count()
    watchdog.start()
    assert threading.active_count() == before


@pytest.mark.timeout(20)
def test_a_stall_that_lasts_is_reported_again_after_a_while(monkeypatch):
    """A report the store lost, or a driver that took the job over since, still hears."""
    monkeypatch.setattr(watchdog_module, "REPORT_AGAIN", 0.5)
    clock, runtime = TrainingClock(), FakeRuntime()
    watchdog = Watchdog(runtime, "w1", HangSettings(timeout=0.2), clock)  # type: ignore[arg-type]
    watchdog.start()
    try:
        clock.start_training()
        wait_until(lambda: len(runtime.store.puts) >= 2, 10, "the stall reported again")
        first, second = (FailureRecord.from_json(v) for _, v, _ in runtime.store.puts[:2])
        assert first.hung and second.hung
    finally:
        watchdog.stop()
