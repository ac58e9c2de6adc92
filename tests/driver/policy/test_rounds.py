"""When to publish the next round, wait or give up (``driver.policy.rounds``): pure
functions of records, plan, book, hosts, the round settings and time, checked decision by
decision. Every timer and every limit of the round rules is here."""

from __future__ import annotations

import dataclasses

import pytest

from driver import events as ev
from driver.policy import lifecycle, occupancy, rounds
from driver.policy.decisions import Book, Fail, Publish, Report, Wait
from driver.policy.memory.failures import FailureBook
from driver.policy.memory.progress import ProgressBook, SnapshotHeld
from driver.policy.memory.rounds import RoundBook
from driver.policy.planner import WorkerSlot, build_plan
from tests.driver.policy.builders import (
    S,
    hs,
    info,
    kinds,
    only,
    plan_of,
    rec,
    settings,
    table,
    view,
)

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


def held(host: str, step: int = 100) -> tuple[SnapshotHeld, ...]:
    """A complete snapshot of ``step`` on ``host``'s disk ("": every worker's)."""
    return (SnapshotHeld(host, step),)


# ----------------------------------------------------------------------------- publishing a round


def test_publishing_a_round_ends_the_streak():
    t = table(rec("a", 0), rec("b", 1))
    decisions, book = rounds.plan_round(
        t,
        None,
        Book(RoundBook(0.0), failures=FailureBook(streak=7)),
        view(),
        settings("-np", "2"),
        now=1.0,
    )
    assert kinds(decisions) == [Publish] and book.failures.streak == 0


def test_a_round_with_no_member_of_the_round_before_says_the_state_is_lost(tmp_path):
    dead = rec("a", 0, state=S.FAILED, exit_code=-9)
    t, before = table(dead, rec("b", 0)), plan_of(1, dead)
    committed = Book(RoundBook(0.0), progress=ProgressBook(step=120))
    # Nothing was ever committed (a script without State): nothing to lose.
    decisions, _ = rounds.plan_round(t, before, Book.start(0.0), view(), settings("-np", "1"), 1.0)
    assert kinds(decisions) == [Publish]
    # Committed, no snapshot: the job ends, naming the step lost and the way out.
    decisions, _ = rounds.plan_round(t, before, committed, view(), settings("-np", "1"), 1.0)
    reason = only(decisions, Fail).reason
    assert "state was lost" in reason and "step 120" in reason and "--checkpoint-dir" in reason
    assert "--on-state-lost restart" in reason
    # Asked to start over: it does, and says so.
    cfg = settings("-np", "1", "--on-state-lost", "restart")
    decisions, _ = rounds.plan_round(t, before, committed, view(), cfg, 1.0)
    assert kinds(decisions) == [Publish, Report]
    assert decisions[1] == Report(ev.StateLost(round=2, previous=1, step=120))
    # A snapshot the new round can read carries the state on: nothing lost.
    for where in ("", "h"):
        book = dataclasses.replace(committed, progress=ProgressBook(120, snapshots=held(where)))
        decisions, _ = rounds.plan_round(t, before, book, view(), settings("-np", "1"), 1.0)
        assert kinds(decisions) == [Publish]
    # One on the disk of a host the new round does not run on does not.
    book = dataclasses.replace(committed, progress=ProgressBook(120, snapshots=held("other-host")))
    cfg = settings("-np", "1", "--checkpoint-dir", str(tmp_path))
    decisions, _ = rounds.plan_round(t, before, book, view(), cfg, 1.0)
    assert "snapshots are on hosts the new round does not run on (other-host)" in (
        only(decisions, Fail).reason
    )
    # A survivor carries the state: nothing to say.
    cfg = settings("-np", "2", "--min-np", "1")
    t = table(dead, rec("b", 1), rec("c", 0))
    decisions, _ = rounds.plan_round(
        t, plan_of(1, dead, rec("b", 1)), Book.start(0.0), view(), cfg, 1.0
    )
    assert only(decisions, Publish).plan.worker_ids == ("b", "c")


# ----------------------------------------------------------------------------- first round


def test_first_round_waits_for_np_within_the_start_timeout():
    cfg = settings("-np", "2", "--start-timeout", "30")
    t = table(rec("a", 0), rec("b", 1, state=S.LAUNCHED))
    decisions, book = rounds.plan_round(
        t, None, Book(RoundBook(0.0, np_registered_at=5.0)), view(), cfg, 10.0
    )
    assert decisions == (Wait(30.0, "-np workers"),) and book.rounds.np_registered_at is None
    decisions, _ = rounds.plan_round(t, None, Book.start(0.0), view(), cfg, 30.5)
    assert decisions == (Fail("only 1 of 2 workers registered within --start-timeout 30s"),)


def test_first_round_grace_for_the_rest_of_those_launched():
    cfg = settings("-np", "2", "-H", "h:3", "--min-np", "2")
    t = table(rec("a", 0), rec("b", 1), rec("c", 2, state=S.LAUNCHED))
    decisions, book = rounds.plan_round(t, None, Book.start(0.0), view("h:3"), cfg, now=4.0)
    assert book.rounds.np_registered_at == 4.0
    assert decisions == (Wait(4.0 + rounds.FIRST_ROUND_GRACE, "the rest of the first workers"),)
    decisions, _ = rounds.plan_round(t, None, book, view("h:3"), cfg, now=4.5)
    assert kinds(decisions) == [Wait]
    decisions, book = rounds.plan_round(t, None, book, view("h:3"), cfg, now=5.1)
    assert only(decisions, Publish).plan.worker_ids == ("a", "b")
    assert book.rounds.resets == 0  # the first round is no reset


def test_first_round_at_once_when_every_launched_worker_registered():
    t = table(rec("a", 0), rec("b", 1))
    decisions, _ = rounds.plan_round(
        t, None, Book(RoundBook(0.0, change_at=0.25)), view(), settings("-np", "2"), now=1.0
    )
    assert decisions == (Publish(build_plan(1, [info("a", "h", 0), info("b", "h", 1)]), 0.75),)


# ----------------------------------------------------------------------------- later rounds


def test_finish_grace_holds_every_round():
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(1, a, b)
    t = table(a, rec("b", 1, state=S.FINISHED, exit_code=0))
    book = Book(RoundBook(0.0, member_finished_at=10.0, done_slots=frozenset({WorkerSlot("h", 1)})))
    cfg = settings("-np", "2", "--min-np", "1")
    decisions, _ = rounds.plan_round(t, p, book, view(), cfg, now=11.0)
    assert decisions == (Wait(10.0 + rounds.FINISH_GRACE, "the others to finish"),)
    decisions, book = rounds.plan_round(t, p, book, view(), cfg, now=12.5)
    assert only(decisions, Publish).plan.worker_ids == ("a",)
    assert book.rounds.resets == 0  # a round for stragglers after a finish is no reset


def test_no_round_and_no_launch_once_training_is_done():
    # However long the others take to finish, a done training never re-forms: a new
    # world would be handed a finished job (the FINISH_GRACE race under load).
    a = rec("a", 0)
    p = plan_of(1, a, rec("b", 1))
    t = table(a, rec("b", 1, state=S.FINISHED, exit_code=0))
    book = Book(RoundBook(0.0, member_finished_at=10.0, training_done_at=0.0))
    cfg = settings("-np", "2", "--min-np", "1")
    decisions, after = rounds.plan_round(t, p, book, view(), cfg, now=10.0 + 60.0)
    assert decisions == () and after == book
    assert occupancy.slots_to_fill(t, hs("h:2"), book, cfg.max_np) == []


def test_join_batch_window_holds_growth_while_the_round_works():
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(1, a)
    cfg = settings("-np", "1", "-H", "h:3", "--min-np", "1")
    young = rec("c", 2, state=S.LAUNCHED, launched_at=9.0)
    t = table(a, rec("b", 1, launched_at=8.0), young)
    decisions, _ = rounds.plan_round(t, p, Book.start(0.0), view("h:3"), cfg, now=10.0)
    assert decisions == (Wait(9.0 + rounds.JOIN_BATCH_WINDOW, "new workers to register"),)
    decisions, _ = rounds.plan_round(t, p, Book.start(0.0), view("h:3"), cfg, now=12.5)
    assert only(decisions, Publish).plan.worker_ids == ("a", "b")
    # A broken round never waits: its survivors are idle.
    broken = table(rec("a", 0, state=S.FAILED, exit_code=1), rec("b", 1, launched_at=8.0), young)
    decisions, _ = rounds.plan_round(
        broken, plan_of(1, a, b), Book.start(0.0), view("h:3"), cfg, 10.0
    )
    assert only(decisions, Publish).plan.worker_ids == ("b",)


def test_reset_limit():
    cfg = settings("-np", "2", "--min-np", "1", "--reset-limit", "1")
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(1, a, b)
    t = table(a, rec("b", 1, state=S.FAILED, exit_code=1))
    decisions, book = rounds.plan_round(t, p, Book.start(0.0), view(), cfg, now=1.0)
    p2 = only(decisions, Publish).plan
    assert book.rounds.resets == 1
    t = table(
        rec("a", 0, state=S.FAILED, exit_code=1),
        rec("b", 1, state=S.FAILED, exit_code=1),
        rec("c", 1, seq=9),
    )
    decisions, book = rounds.plan_round(t, p2, book, view(), cfg, now=2.0)
    assert decisions == (Fail("reset limit exceeded: the job re-formed 2 times (--reset-limit 1)"),)


def test_round_formation_time_counts_from_the_first_change():
    cfg = settings("-np", "2", "--min-np", "1")
    a, b = rec("a", 0), rec("b", 1)
    t = table(a, rec("b", 1, state=S.FAILED, exit_code=-9))
    decisions, book = rounds.plan_round(
        t, plan_of(1, a, b), Book.start(0.0).changed(3.0).changed(3.5), view(), cfg, now=3.25
    )
    assert only(decisions, Publish).seconds == 0.25 and book.rounds.change_at is None


# ----------------------------------------------------------------------------- broken rounds


def test_broken_round_clock_report_and_elastic_timeout():
    cfg = settings("-np", "2", "--elastic-timeout", "5")
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(2, a, b)
    t = table(a, rec("b", 1, state=S.FAILED, exit_code=-9))
    decisions, book = rounds.plan_round(t, p, Book.start(0.0), view(), cfg, now=10.0)
    assert book.rounds.broken_since == 10.0 and not book.rounds.waiting_reported
    assert decisions == (
        Wait(10.0 + rounds.WAITING_REPORT_AFTER, "a round to re-form"),
        Wait(15.0, "--elastic-timeout"),
    )
    decisions, book = rounds.plan_round(t, p, book, view(), cfg, now=11.5)
    assert decisions == (
        Report(
            ev.Waiting(what="round 2 lost workers; waiting for 2 to re-form (have 1)", waited=1.5)
        ),
        Wait(15.0, "--elastic-timeout"),
    )
    assert book.rounds.waiting_reported
    decisions, book = rounds.plan_round(t, p, book, view(), cfg, now=12.0)
    assert decisions == (Wait(15.0, "--elastic-timeout"),)  # reported once
    decisions, _ = rounds.plan_round(t, p, book, view(blacklisted=("x",)), cfg, now=15.5)
    assert decisions == (
        Fail(
            "no round of at least 2 workers could form within "
            "--elastic-timeout 5s (have 1; blacklisted: x)"
        ),
    )


def test_a_lapse_that_ends_resets_the_broken_clock():
    cfg = settings("-np", "2")
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(1, a, b)
    decisions, book = rounds.plan_round(
        table(a, b), p, Book(RoundBook(0.0, broken_since=3.0)), view(), cfg, now=4.0
    )
    assert decisions == () and book.rounds.broken_since is None


def test_script_failing_in_two_rounds_in_a_row_ends_the_job():
    a, b = rec("a", 0), rec("b", 1)
    failed = table(
        rec("a", 0, state=S.FAILED, exit_code=3), rec("b", 1, state=S.FAILED, exit_code=3)
    )
    book, fail = rounds.script_fails(failed, plan_of(1, a, b), FailureBook())
    assert fail is None and book.all_failed_rounds == {1}
    book, fail = rounds.script_fails(failed, plan_of(2, a, b), book)
    assert fail == Fail(
        "every worker of rounds 1 and 2 exited with an error (codes [3]): the "
        "training script fails; see the worker output above"
    )
    # Not in a row, a signal, or a stop: replaced as usual.
    assert (
        rounds.script_fails(
            failed,
            plan_of(4, a, b),
            FailureBook(all_failed_rounds=frozenset({2})),
        )[1]
        is None
    )
    after_one = FailureBook(all_failed_rounds=frozenset({1}))
    killed = table(
        rec("a", 0, state=S.FAILED, exit_code=3), rec("b", 1, state=S.FAILED, exit_code=-9)
    )
    assert rounds.script_fails(killed, plan_of(2, a, b), after_one) == (after_one, None)
    stopped = table(
        rec("a", 0, state=S.FAILED, exit_code=3), rec("b", 1, state=S.STOPPED, exit_code=3)
    )
    assert rounds.script_fails(stopped, plan_of(2, a, b), after_one) == (after_one, None)


def test_plan_round_applies_the_script_rule_to_a_broken_round():
    cfg = settings("-np", "2")
    a, b = rec("a", 0), rec("b", 1)
    failed = table(
        rec("a", 0, state=S.FAILED, exit_code=3), rec("b", 1, state=S.FAILED, exit_code=3)
    )
    decisions, _ = rounds.plan_round(
        failed,
        plan_of(2, a, b),
        Book(RoundBook(0.0), failures=FailureBook(all_failed_rounds=frozenset({1}))),
        view(),
        cfg,
        1.0,
    )
    assert "the training script fails" in only(decisions, Fail).reason


# ----------------------------------------------------------------------------- wake-up


def test_next_wakeup_is_the_earliest_wait_within_bounds():
    assert rounds.next_wakeup([], now=0.0) == rounds.MAX_SLEEP
    waits = [Wait(10.4, "x"), Wait(10.2, "y"), Wait(30.0, "z")]
    assert rounds.next_wakeup(waits, now=10.0) == pytest.approx(0.2)
    assert rounds.next_wakeup(waits, now=11.0) == rounds.MIN_SLEEP  # overdue: at once
    assert rounds.next_wakeup([Wait(50.0, "far")], now=0.0) == rounds.MAX_SLEEP


# ----------------------------------------------------------------------------- rounds lost


def test_rounds_of_workers_dying_on_their_own_end_the_job_after_the_limit():
    cfg = settings("-np", "2")
    aborted = table(
        rec("a", 0, state=S.FAILED, exit_code=-6), rec("b", 1, state=S.FAILED, exit_code=-6)
    )
    a, b = rec("a", 0), rec("b", 1)
    failures = FailureBook()
    for round_id in range(1, rounds.LOST_ROUNDS_LIMIT):
        failures, fail = rounds.rounds_lost(aborted, plan_of(round_id, a, b), failures)
        assert fail is None
    assert failures.lost_rounds == frozenset(range(1, rounds.LOST_ROUNDS_LIMIT))
    book = Book(RoundBook(0.0), failures=failures)
    decisions, _ = rounds.plan_round(
        aborted, plan_of(rounds.LOST_ROUNDS_LIMIT, a, b), book, view(), cfg, now=1.0
    )
    assert only(decisions, Fail).reason == (
        "every worker of rounds 1 to 3 died (killed by SIGABRT) with no survivor to hand "
        "the training state on: the job started over 3 times in a row; see the worker "
        "output above"
    )
    # Not in a row, or a member the driver (or the chaos) killed: replaced as usual.
    gap = FailureBook(lost_rounds=frozenset({1, 3}))
    assert rounds.rounds_lost(aborted, plan_of(4, a, b), gap)[1] is None
    killed = table(
        rec("a", 0, state=S.FAILED, exit_code=-6),
        lifecycle.exited(lifecycle.killed(rec("b", 1), 1.0, reason="hung"), -9, 2.0),
    )
    after_two = FailureBook(lost_rounds=frozenset({1, 2}))
    assert rounds.rounds_lost(killed, plan_of(3, a, b), after_two) == (after_two, None)


# ----------------------------------------------------------------------------- the script fails


def test_a_round_whose_workers_all_fail_on_their_own_says_the_script_fails():
    """Every member of round 1 exits 1 after committing: the next round has none of
    them, and the reason is the script failing, not the state lost."""
    cfg = settings("-np", "2", checkpoint_dir="/ckpt")
    p = plan_of(1, rec("a", 0), rec("b", 1))
    t = table(
        rec("a", 0, state=S.FAILED, exit_code=1),
        rec("b", 1, state=S.FAILED, exit_code=1),
        rec("c", 0, seq=10),
        rec("d", 1, seq=11),
    )
    step = rounds.plan_round(
        t, p, Book(RoundBook(0.0), progress=ProgressBook(step=40)), view("h:2"), cfg, now=1.0
    )
    reason = only(step.decisions, Fail).reason
    assert "the training script fails" in reason and "state was lost" not in reason
