"""What the job says while it waits on something outside it, and how training goes
(``driver.policy.reports``): no host listed, discovery errors, the store, progress."""

from __future__ import annotations

import pytest

from driver import events as ev
from driver.policy import exits, reports, rounds
from driver.policy.decisions import Book, Fail, HostsView, Report, StoreHealth, Succeed, Wait
from driver.policy.memory.rounds import RoundBook
from driver.policy.reports import HostSource
from driver.policy.rounds import RoundSettings
from rendezvous.schema.rounds import Plan
from tests.driver.policy.builders import S, config, kinds, only, plan_of, progress, rec, table, view

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


# ----------------------------------------------------------------------------- helpers


def progress_event(decisions) -> ev.Progress:
    """The ``Progress`` the first decision reports."""
    event = only(decisions[:1], Report).event
    assert isinstance(event, ev.Progress), event
    return event


# ----------------------------------------------------------------------------- no hosts


def test_no_hosts_is_said_at_once_and_every_few_seconds():
    cfg = config("-np", "2", "--start-timeout", "30")
    source = HostSource.from_config(cfg)
    empty = HostsView(usable=(), none_listed=True)
    decisions, book = reports.no_hosts(Book.start(0.0), empty, source, now=1.0)
    said = waiting_of(decisions)
    assert said.what == "a host: the host list lists none" and said.waited == 0.0
    assert decisions[-1] == Wait(1.0 + reports.REPEAT_REPORT_EVERY, only(decisions[1:], Wait).why)
    decisions, book = reports.no_hosts(book, empty, source, now=4.0)
    assert kinds(decisions) == [Wait]  # not again so soon
    decisions, book = reports.no_hosts(book, empty, source, now=6.0)
    assert waiting_of(decisions).waited == 5.0
    # The start timeout names the empty list, not a count of registrations.
    decisions, _ = rounds.plan_round(
        {}, None, book, empty, RoundSettings.from_config(cfg), now=31.0
    )
    assert only(decisions, Fail).reason == (
        "discovery has listed no host for 30s: no worker could start within --start-timeout 30s"
    )
    # Hosts came: the memory of the empty list goes.
    decisions, book = reports.no_hosts(book, view("h:2"), source, now=7.0)
    assert (
        decisions == ()
        and book.hosts.no_hosts_since is None
        and book.hosts.no_hosts_said_at is None
    )


def test_an_empty_list_mid_run_says_the_job_keeps_its_hosts():
    source = HostSource.from_config(config("-np", "2", discovery_script="./discover"))
    kept = view("h:2", none_listed=True)
    decisions, _ = reports.no_hosts(Book.start(0.0), kept, source, now=1.0)
    assert waiting_of(decisions).what == (
        "a host: the discovery script lists none (the job keeps its 1 host meanwhile)"
    )


def test_a_discovery_error_is_said_when_new_then_at_most_every_30_seconds():
    def said(step) -> ev.HostDiscoveryFailed:
        event = only(step.decisions, Report).event
        assert isinstance(event, ev.HostDiscoveryFailed)
        return event

    step = reports.discovery_failed(Book.start(0.0), "script exited 1", now=1.0)
    assert str(said(step)) == "host discovery failed: script exited 1"
    for now in (2.0, 3.0, 4.0):  # the same error again, every second
        step = reports.discovery_failed(step.book, "script exited 1", now)
        assert step.decisions == ()
    step = reports.discovery_failed(
        step.book, "script exited 1", 1.0 + reports.DISCOVERY_ERROR_EVERY
    )
    assert said(step).again == 3
    assert "(3 more failed runs since it was last said)" in str(said(step))
    step = reports.discovery_failed(step.book, "script timed out", 32.0)  # news: at once
    assert said(step).again == 0
    book = reports.discovery_succeeded(step.book)  # a run that succeeds: the next is news
    assert reports.discovery_failed(book, "script timed out", 33.0).decisions


def waiting_of(decisions) -> ev.Waiting:
    reports = [d for d in decisions if isinstance(d, Report)]
    assert len(reports) == 1 and isinstance(reports[0].event, ev.Waiting), decisions
    return reports[0].event


# ----------------------------------------------------------------------------- the store, progress


def test_an_unreachable_store_is_said_at_once_again_and_when_back():
    health, said = reports.store_health(StoreHealth(), True, "", now=1.0)
    assert health == StoreHealth() and said == []
    health, said = reports.store_health(health, False, "refused", now=2.0)
    assert said == [ev.StoreUnreachable(seconds=0.0, error="refused")]
    health, said = reports.store_health(health, False, "timed out", now=4.0)
    assert said == [] and health.error == "timed out"  # not again so soon
    health, said = reports.store_health(health, False, "timed out", now=2.0 + 5.0)
    assert said == [ev.StoreUnreachable(seconds=5.0, error="timed out")]
    health, said = reports.store_health(health, False, "timed out", now=11.0)
    assert said == []
    health, said = reports.store_health(health, True, "", now=12.5)
    assert said == [ev.StoreBack(seconds=10.5)] and health == StoreHealth()
    assert str(said[0]) == "the rendezvous store is back after 10s"


def test_an_outage_past_the_bound_ends_the_job_and_a_shorter_one_does_not():
    assert reports.store_outage_over(StoreHealth(), 1000.0, 12.0) is None
    away = StoreHealth(down_since=100.0, said_at=100.0, error="deadline exceeded")
    assert reports.store_outage_over(away, 112.0, 12.0) is None  # (a stall ridden out)
    why = reports.store_outage_over(away, 113.5, 12.0)
    assert why is not None
    assert "more than --elastic-timeout 12s" in why and "deadline exceeded" in why


class Reports:
    """The driver's side of rank 0's progress records, on a fake clock: ``report`` is
    a record heard at ``now``, ``line`` a turn of the progress rule (its event, if it
    says one)."""

    def __init__(self, *args: str):
        self.cfg = progress(*args)
        self.book = Book.start(0.0)

    def report(self, step: int, now: float, round_id: int = 1) -> None:
        self.book = reports.progress_reported(self.book, step, round_id, self.cfg, now)

    def said(self, now: float, plan: Plan | None = None) -> list[ev.Progress]:
        plan = plan or plan_of(1, rec("a", 0), rec("b", 1))
        decisions, self.book = reports.progress_report(self.book, plan, self.cfg, now)
        return [
            d.event for d in decisions if isinstance(d, Report) and isinstance(d.event, ev.Progress)
        ]

    def line(self, now: float, plan: Plan | None = None) -> ev.Progress:
        said = self.said(now, plan)
        assert len(said) == 1, said
        return said[0]


def test_progress_is_said_at_rank_0s_first_report_then_every_interval():
    heard = Reports("--progress-interval", "10")
    assert heard.said(now=1.0) == []  # no step reported yet
    heard.report(3, now=1.0)
    assert heard.line(now=1.0) == ev.Progress(round=1, size=2, step=3, steps_per_second=None)
    decisions, _ = reports.progress_report(heard.book, plan_of(1), heard.cfg, now=5.0)
    assert decisions == (Wait(11.0, "the next progress line"),)
    off = progress("--progress-interval", "0")
    assert reports.progress_report(heard.book, plan_of(1), off, now=100.0) == ((), heard.book)
    assert reports.progress_report(heard.book, None, heard.cfg, now=100.0) == ((), heard.book)


def test_the_line_says_the_newest_step_across_rounds_and_its_rate_over_the_interval():
    """Rank 0 reports every second (``progress_period``), whichever worker it is: each
    line says the step of a second ago at most, never the same step again while training
    runs, and the rate over the last interval of wall time."""
    heard = Reports("--progress-interval", "10")
    lines: list[ev.Progress] = []
    for t in range(1, 32):  # 17 steps/s; a new round (and rank 0) every 4 seconds
        heard.report(17 * t, now=float(t), round_id=1 + t // 4)
        lines += heard.said(now=t + 0.5, plan=plan_of(1 + t // 4, rec("a", 0)))
    said = lines
    assert [(p.round, p.step) for p in said] == [(1, 17), (3, 187), (6, 357), (8, 527)]
    assert [p.steps_per_second for p in said] == [None, 17.0, 17.0, 17.0]
    assert str(said[1]) == "progress: round 3, 1 worker, step 187 (17.0 steps/s)"


def test_a_stall_reads_0_steps_per_second_and_a_quiet_rank_0_is_said():
    heard = Reports("--progress-interval", "10")
    heard.report(10, now=1.0)
    assert heard.line(now=1.0).steps_per_second is None
    for t in range(2, 12):
        heard.report(min(10 * t, 50), now=float(t))  # no new step from t=5 on
    assert heard.line(now=11.0).steps_per_second == 4.0  # 40 steps from t=1 to t=11
    for t in range(12, 22):
        heard.report(50, now=float(t))
    assert heard.line(now=21.0).steps_per_second == 0.0
    # Rank 0 not heard for more than 3 report periods: its step is that old, no rate.
    quiet = heard.line(now=31.0)
    assert quiet.steps_per_second is None and quiet.quiet_for == 10.0
    assert str(quiet) == "progress: round 1, 2 workers, step 50 (rank 0 not heard for 10s)"


def test_a_step_that_went_back_is_said_and_the_rate_never_goes_negative():
    """The state lost (or a resume from an older snapshot): rank 0's step goes back;
    the line says so instead of a negative rate, and the rate starts over from there."""
    heard = Reports("--progress-interval", "10")
    heard.report(20, now=1.0, round_id=4)
    heard.line(now=1.0)
    for t in range(2, 11):
        heard.report(20 * t, now=float(t), round_id=4)
    heard.report(3, now=11.0, round_id=7)  # round 7 trains from the initial state
    back = heard.line(now=11.0)
    assert back.step == 3 and back.back_from == 200 and back.steps_per_second is None
    assert str(back) == "progress: round 1, 2 workers, step 3 (went back from step 200)"
    for t in range(12, 22):
        heard.report(3 + 5 * (t - 11), now=float(t), round_id=7)
    after = heard.line(now=21.0)
    assert after.back_from is None and after.steps_per_second == 5.0
    # A record of an older round heard late (its rank 0 had not yet seen the new one)
    # is no going back.
    heard.report(210, now=21.5, round_id=4)
    assert heard.book.progress.step == 53 and heard.book.progress.back_from is None


def test_the_rate_spans_an_outage_at_its_true_length():
    """No report while the store is away, then two delivered at once: the rate is the
    steps over the whole time between the reports at the window's ends, not a burst
    over the milliseconds between the late ones."""
    heard = Reports("--progress-interval", "10")
    heard.report(10, now=1.0)
    heard.line(now=1.0)
    for t in range(2, 11):
        heard.report(10 * t, now=float(t))
    assert heard.line(now=11.0).steps_per_second == 10.0
    assert heard.line(now=21.0).quiet_for == 11.0
    heard.report(290, now=30.0)
    heard.report(300, now=30.001)
    after = heard.line(now=31.0)
    assert after.quiet_for is None and after.steps_per_second == pytest.approx(10.0, rel=1e-3)


def test_the_job_done_line_says_the_step_training_ended_at():
    p = plan_of(3, rec("a", 0), rec("b", 1))
    done = table(
        rec("a", 0, state=S.FINISHED, exit_code=0), rec("b", 1, state=S.FINISHED, exit_code=0)
    )
    heard = Reports("--progress-interval", "0")  # no lines, and still the last step
    heard.book = Book(RoundBook(0.0, resets=2))
    heard.report(60, now=4.0, round_id=3)  # (a finish record, heard as the job ends)
    succeed = exits.outcome(done, p, heard.book)
    assert succeed == Succeed(3, 2, 2, step=60)
    assert isinstance(succeed, Succeed)
    event = ev.JobDone(succeed.round, succeed.size, succeed.resets, succeed.step)
    assert str(event) == "job done in round 3 at step 60 (2 workers, 2 resets)"
    assert str(ev.JobDone(3, 2, 2)) == "job done in round 3 (2 workers, 2 resets)"
