"""The warm-spare rules (``driver.policy.spares``) and how the other rules leave spares
alone: pure functions of records, book, hosts and time, checked decision by decision.
(The loop with fake processes: tests/driver/job/test_loop.py; real processes:
tests/system/jobs/test_spares.py.)"""

from __future__ import annotations

import dataclasses

import pytest

from driver import events as ev
from driver.policy import exits, lifecycle, occupancy, rounds, spares
from driver.policy.decisions import (
    Book,
    CountFailure,
    Launch,
    LaunchSpare,
    Promote,
    Publish,
    Report,
    Stop,
    Succeed,
    Wait,
)
from driver.policy.lifecycle import WorkerRecord, WorkerState
from driver.policy.memory.failures import FailureBook
from driver.policy.memory.rounds import RoundBook
from driver.policy.memory.spares import SpareBook, SpareHold
from driver.policy.planner import WorkerSlot
from tests.driver.policy.builders import (
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

S = WorkerState
P1 = plan_of(1, rec("a", 0))  # a round formed: spares may start


def spare(
    wid: str,
    index: int = 0,
    state: WorkerState = S.REGISTERED,
    host: str = "h",
    seq: int = 0,
    since: float = 0.0,
) -> WorkerRecord:
    """A spare record (``index``: its place among the host's spares)."""
    r = rec(wid, index, state=state, host=host, seq=seq or 100 + index, since=since)
    if state is not S.REGISTERED:
        r = dataclasses.replace(r, registered_seq=seq)
    return dataclasses.replace(r, spare=True)


# ----------------------------------------------------------------------------- lifecycle


def test_a_spare_is_no_candidate_until_promoted_into_a_slot():
    s = WorkerRecord.launched("s", "h", 0, now=1.0, spare=True)
    assert s.spare and not s.live and not s.ready_spare
    s = lifecycle.registered(s, info("s", "h", 0), created_revision=7, now=2.0)
    assert s.ready_spare and not s.live and s.state is S.REGISTERED
    p = lifecycle.promoted(s, slot=3, now=5.0)
    assert not p.spare and p.live and not p.ready_spare and p.info is not None
    assert (p.slot, p.info.slot, p.since, p.registered_seq) == (3, 3, 5.0, 7)
    # Registering again (a lease lost and renewed) keeps the slot the driver gave it.
    lapsed = lifecycle.unregistered(p, now=6.0)
    again = lifecycle.registered(lapsed, info("s", "h", 0), created_revision=9, now=7.0)
    assert again.live and again.info is not None and (again.info.slot, again.slot) == (3, 3)


def test_live_infos_leave_spares_out():
    t = table(rec("a", 0), spare("s", 0), spare("t", 1, state=S.LAUNCHED))
    assert [i.worker_id for i in rounds.live_infos(t)] == ["a"]


# ----------------------------------------------------------------------------- filling slots


def test_a_free_slot_goes_to_a_registered_spare_of_its_host():
    t = table(spare("s", 0))
    assert spares.fill_slots([WorkerSlot("h", 1)], t) == [Promote("s", "h", 1)]


def test_a_spare_still_starting_is_not_waited_for():
    t = table(spare("s", 0, state=S.LAUNCHED))
    assert spares.fill_slots([WorkerSlot("h", 1)], t) == [Launch("h", 1)]


@pytest.mark.parametrize("state", [S.UNREGISTERED, S.STOPPING, S.KILLED, S.FAILED, S.STOPPED])
def test_a_spare_not_registered_and_running_is_not_promoted(state):
    t = table(spare("s", 0, state=state))
    assert spares.fill_slots([WorkerSlot("h", 1)], t) == [Launch("h", 1)]


def test_a_spare_never_moves_to_another_host():
    t = table(spare("s", 0, host="other"))
    assert spares.fill_slots([WorkerSlot("h", 1)], t) == [Launch("h", 1)]


def test_the_longest_registered_spares_go_first_then_fresh_processes():
    t = table(spare("young", 0, seq=9), spare("old", 1, seq=4), spare("x", 0, host="g", seq=1))
    free = [WorkerSlot("h", 2), WorkerSlot("h", 3), WorkerSlot("h", 4), WorkerSlot("g", 0)]
    assert spares.fill_slots(free, t) == [
        Promote("old", "h", 2),
        Promote("young", "h", 3),
        Launch("h", 4),
        Promote("x", "g", 0),
    ]


def test_spares_hold_no_slot_and_do_not_count_against_max_np():
    cfg = settings("-np", "2", "--spares", "2")
    # Spare indices 0 and 1 are no member slots: both slots are free.
    t = table(spare("s", 0), spare("t", 1, state=S.LAUNCHED))
    assert occupancy.slots_to_fill(t, hs("h:2"), Book.start(0.0), cfg.max_np) == [
        Promote("s", "h", 0),
        Launch("h", 1),
    ]
    t = table(rec("a", 0), rec("b", 1), spare("s", 0), spare("t", 1))
    assert occupancy.slots_to_fill(t, hs("h:2"), Book.start(0.0), cfg.max_np) == []


def test_no_promotion_once_training_is_done():
    t = table(rec("a", 0), spare("s", 0))
    done = Book(RoundBook(0.0, training_done_at=0.0))
    assert occupancy.slots_to_fill(t, hs("h:2"), done, None) == []


# ----------------------------------------------------------------------------- the pool


def test_each_usable_host_gets_its_missing_spares():
    t = table(rec("a", 0), spare("s", 1), spare("gone", 0, state=S.FAILED, seq=5))
    decisions = spares.spares_to_launch(t, P1, hs("h:1,g:1"), Book.start(0.0), 2, now=1.0)
    assert decisions == [LaunchSpare("h", 0), LaunchSpare("g", 0), LaunchSpare("g", 1)]


def test_a_spare_being_stopped_or_killed_is_replaced_already():
    t = table(spare("s", 0, state=S.STOPPING), spare("k", 1, state=S.KILLED))
    assert spares.spares_to_launch(t, P1, hs("h:1"), Book.start(0.0), 2, 1.0) == [
        LaunchSpare("h", 0),
        LaunchSpare("h", 1),
    ]


def test_spares_start_once_the_first_round_formed():
    # Before it, they would only slow the first workers' start.
    assert spares.spares_to_launch({}, None, hs("h:1"), Book.start(0.0), 1, 1.0) == []
    assert spares.spares_to_launch({}, P1, hs("h:1"), Book.start(0.0), 1, 1.0) == [
        LaunchSpare("h", 0)
    ]


def test_a_spare_that_cannot_be_started_is_lost_and_holds_its_host():
    decisions, book = spares.spare_launch_failed("s", "h", "no such host", Book.start(0.0), now=3.0)
    assert decisions == (
        Report(
            ev.SpareLost(worker="s", host="h", code=None, registered=False, reason="no such host")
        ),
        CountFailure("h", None, "no such host", streak=False),
    )
    assert book.spares.holds == (("h", 3.0 + spares.SPARE_RETRY_DELAY),)


def test_no_spare_without_the_flag_once_training_is_done_or_off_the_usable_hosts():
    assert spares.spares_to_launch({}, P1, hs("h:1"), Book.start(0.0), 0, 1.0) == []
    assert (
        spares.spares_to_launch(
            {}, P1, hs("h:1"), Book(RoundBook(0.0, training_done_at=0.0)), 1, 1.0
        )
        == []
    )
    # A blacklisted or cooling host is not in the usable list: no spare there.
    assert spares.spares_to_launch({}, P1, hs("h:1"), Book.start(0.0), 1, 1.0) == [
        LaunchSpare("h", 0)
    ]


def test_a_promotion_holds_its_hosts_refill_for_the_delay():
    book = spares.spare_promoted(Book.start(0.0), "h", now=10.0)
    until = 10.0 + spares.SPARE_REFILL_DELAY
    assert book.spares.holds == (("h", until),)
    # The round re-forms first; the other hosts are not held.
    assert spares.spares_to_launch({}, P1, hs("h:1,g:1"), book, 1, now=10.5) == [
        Wait(until, "a spare on h to be started again"),
        LaunchSpare("g", 0),
    ]
    assert spares.spares_to_launch({}, P1, hs("h:1"), book, 1, now=until + 0.01) == [
        LaunchSpare("h", 0)
    ]
    # A later hold stays; an expired one is forgotten.
    longer = dataclasses.replace(book, spares=SpareBook((SpareHold("h", 99.0),)))
    assert spares.spare_promoted(longer, "h", 10.0).spares.holds == (("h", 99.0),)
    assert spares.spare_promoted(book, "g", 50.0).spares.holds == (
        ("g", 50.0 + spares.SPARE_REFILL_DELAY),
    )


def test_spares_of_a_host_that_left_are_stopped_and_members_rules_ignore_spares():
    t = table(
        spare("s", 0, host="gone"),
        spare("t", 0, host="h"),
        spare("u", 5, host="h"),  # spare index 5 on a 1-slot host: no member slot, fine
        spare("v", 1, host="gone", state=S.STOPPING),
    )
    why = "its host left the job"
    assert spares.spares_to_stop(t, hs("h:1")) == [
        Report(ev.WorkerStopping(worker="s", host="gone", slot=0, reason=why)),
        Stop("s", why),
    ]
    assert occupancy.workers_to_stop(t, hs("h:1")) == []


# ----------------------------------------------------------------------------- exits


def test_a_registered_spare_dying_is_quiet_and_counts_for_its_host_only():
    s = spare("s", 0)
    book = Book(RoundBook(0.0), failures=FailureBook(streak=2))
    done, (decisions, after) = exits.worker_exited(s, -9, plan_of(1, rec("a")), book, now=5.0)
    assert done.state is S.FAILED and done.exit_code == -9
    assert decisions == (
        Report(ev.SpareLost(worker="s", host="h", code=-9, registered=True)),
        CountFailure("h", -9, streak=False),
    )
    # No round changed, no streak, no finish, no hold: its replacement starts at once.
    assert after == book


def test_a_spare_dying_before_it_registered_holds_its_host():
    s = spare("s", 0, state=S.LAUNCHED)
    _, (decisions, book) = exits.worker_exited(s, 1, None, Book.start(0.0), now=5.0)
    assert kinds(decisions) == [Report, CountFailure]
    until = 5.0 + spares.SPARE_RETRY_DELAY
    assert book.spares.holds == (("h", until),)
    assert spares.spares_to_launch({}, P1, hs("h:1"), book, 1, 6.0) == [
        Wait(until, "a spare on h to be started again")
    ]


def test_a_spare_exiting_0_finishes_nothing():
    _, (decisions, book) = exits.worker_exited(spare("s", 0), 0, None, Book.start(0.0), now=5.0)
    assert isinstance(decisions[0], Report) and isinstance(decisions[0].event, ev.SpareLost)
    assert book.rounds.done_slots == frozenset() and book.rounds.member_finished_at is None
    assert not book.training_done


def test_a_spare_the_driver_stopped_or_killed_is_not_counted():
    stopping = spare("s", 0, state=S.STOPPING)
    done, (decisions, _) = exits.worker_exited(stopping, -15, None, Book.start(0.0), 5.0)
    assert done.state is S.STOPPED
    assert decisions == (Report(ev.WorkerStopped(worker="s", host="h", slot=0, code=-15)),)
    killed = lifecycle.killed(spare("k", 0, state=S.UNREGISTERED), 4.0, reason="hung")
    _, (decisions, _) = exits.worker_exited(killed, -9, None, Book.start(0.0), 5.0)
    assert kinds(decisions) == [Report]


# ----------------------------------------------------------------------------- rounds


def test_the_first_round_does_not_wait_for_spares():
    cfg = settings("-np", "2", "--spares", "2")
    t = table(rec("a", 0), rec("b", 1), spare("s", 0, state=S.LAUNCHED), spare("t", 1))
    decisions, _ = rounds.plan_round(t, None, Book.start(0.0), view(), cfg, now=1.0)
    assert only(decisions, Publish).plan.worker_ids == ("a", "b")


def test_a_growth_does_not_wait_for_spares_starting_behind_it():
    a, p = rec("a", 0), plan_of(1, rec("a", 0))
    cfg = settings("-np", "1", "-H", "h:2", "--min-np", "1", "--spares", "1")
    promoted = lifecycle.promoted(spare("s", 0), slot=1, now=9.0)
    t = table(a, promoted, spare("new", 0, state=S.LAUNCHED))
    decisions, _ = rounds.plan_round(t, p, Book.start(0.0), view("h:2"), cfg, now=9.0)
    assert only(decisions, Publish).plan.worker_ids == ("a", "s")


def test_a_broken_round_re_forms_at_once_with_the_promoted_spare():
    a, b = rec("a", 0), rec("b", 1)
    t = table(a, rec("b", 1, state=S.FAILED, exit_code=-9), spare("s", 0))
    cfg = settings("-np", "2", "--spares", "1")
    (promote,) = occupancy.slots_to_fill(t, hs("h:2"), Book.start(0.0), cfg.max_np)
    assert promote == Promote("s", "h", 1)
    t["s"] = lifecycle.promoted(t["s"], promote.slot, now=5.0)
    decisions, _ = rounds.plan_round(
        t, plan_of(1, a, b), Book(RoundBook(0.0, change_at=5.0)), view(), cfg, 5.0
    )
    plan = only(decisions, Publish).plan
    member = plan.member("s")
    assert plan.worker_ids == ("a", "s") and member is not None and member.slot == 1


def test_idle_spares_do_not_hold_the_jobs_end():
    a, b = rec("a", 0), rec("b", 1)
    t = table(
        rec("a", 0, state=S.FINISHED, exit_code=0),
        rec("b", 1, state=S.FINISHED, exit_code=0),
        spare("s", 0),
    )
    assert exits.outcome(t, plan_of(1, a, b), Book.start(0.0)) == Succeed(1, 2, 0)
