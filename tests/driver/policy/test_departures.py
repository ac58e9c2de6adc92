"""Workers that leave on purpose (``driver.policy.departures``, and the rules that use
it: a preempted host with members elsewhere, a host discovery dropped): a handover, not
a loss. Pure: records, plan, book and time in, decisions out."""

from __future__ import annotations

import dataclasses

import pytest

from driver import events as ev
from driver.flags import HANDOFF_WAIT
from driver.policy import departures, occupancy, preemption, reports, rounds
from driver.policy.decisions import Book, HostLost, Leave, Publish, Report, SnapshotNow, Stop, Wait
from driver.policy.departures import LEAVE_WAIT, is_handover, leave_at_commit, leaving_due
from driver.policy.memory.hosts import Departure, Drain, HostBook
from driver.policy.memory.progress import ProgressBook
from driver.policy.memory.rounds import RoundBook
from driver.policy.planner import build_plan
from rendezvous.schema.rounds import handover_for
from rendezvous.schema.workers import WorkerInfo
from tests.driver.policy.builders import (
    S,
    hs,
    kinds,
    only,
    plan_of,
    progress,
    rec,
    settings,
    table,
    view,
)

pytestmark = pytest.mark.unit

WHY = "its host b is drained"


def two_hosts():
    """Round 1: a0, a1 on host a; b0, b1 on host b."""
    t = table(
        rec("a0", 0, host="a"),
        rec("a1", 1, host="a"),
        rec("b0", 0, host="b"),
        rec("b1", 1, host="b"),
    )
    plan = build_plan(1, [r.info for r in t.values() if r.info is not None])
    return t, plan


def test_a_preempted_host_with_members_elsewhere_hands_over():
    t, plan = two_hosts()
    t["b2"] = rec("b2", 2, host="b", state=S.LAUNCHED)  # starting: no member, stops now
    step = preemption.host_preempted(t, plan, Book.start(0), "b", True, 10.0, min_np=2)
    assert step.decisions == (
        Report(ev.HostPreempted("b", ["b0", "b1", "b2"], snapshot=False, handover=True)),
        HostLost("b", "preempted"),
        Leave("b0", WHY, 10.0 + LEAVE_WAIT),
        Leave("b1", WHY, 10.0 + LEAVE_WAIT),
        Stop("b2", WHY),
    )


def test_too_few_members_elsewhere_means_a_snapshot_first():
    t, plan = two_hosts()
    step = preemption.host_preempted(t, plan, Book.start(0), "b", True, 10.0, min_np=3)
    assert isinstance(step.decisions[1], SnapshotNow), step.decisions
    assert step.book.hosts.draining == (Drain("b", 2, 10.0 + preemption.DRAIN_WAIT),)


def test_a_preemption_said_again_while_its_workers_leave_does_nothing():
    t, plan = two_hosts()
    t["b0"] = rec("b0", 0, host="b", state=S.STOPPING)
    book = Book(RoundBook(0), hosts=HostBook(leaving=(Departure("b0", 25.0),)))
    assert preemption.host_preempted(t, plan, book, "b", False, 11.0).decisions == ()


def test_the_round_without_leaving_workers_is_a_handover_and_without_a_dead_one_is_not():
    t, plan = two_hosts()
    for w in ("b0", "b1"):
        t[w] = rec(w, int(w[1]), host="b", state=S.STOPPING)
    book = Book(
        RoundBook(0), hosts=HostBook(leaving=(Departure("b0", 25.0), Departure("b1", 25.0)))
    )
    step = rounds.plan_round(
        t, plan, book, view("a:2"), settings("-np", "4", "--min-np", "2"), 11.0
    )
    published = [d for d in step.decisions if isinstance(d, Publish)]
    assert [p.plan.worker_ids for p in published] == [("a0", "a1")]
    assert published[0].plan.handover
    # b1 died meanwhile: the old ring is broken, so the round changes at once.
    t["b1"] = rec("b1", 1, host="b", state=S.FAILED)
    assert not is_handover(plan, published[0].plan, t, book)
    # Nobody left stays: no handover (the state goes with nobody).
    assert not is_handover(plan, build_plan(2, []), t, Book.start(0))


def test_leaving_workers_are_forgotten_once_gone_and_stopped_when_overdue():
    t, _ = two_hosts()
    t["b0"] = rec("b0", 0, host="b", state=S.STOPPED)
    t["b1"] = rec("b1", 1, host="b", state=S.STOPPING)
    book = Book(
        RoundBook(0), hosts=HostBook(leaving=(Departure("b0", 25.0), Departure("b1", 25.0)))
    )
    step = leaving_due(t, book, 20.0)
    assert step.decisions == (Wait(25.0, "b1 to leave at its next commit"),)
    assert step.book.hosts.leaving == (Departure("b1", 25.0),)
    late = leaving_due(t, step.book, 25.0)
    assert late.decisions == (Stop("b1", "it did not leave at a commit in time"),)
    assert late.book.hosts.leaving == ()


def test_members_of_a_host_discovery_dropped_leave_at_their_commit():
    t, plan = two_hosts()
    t["b2"] = rec("b2", 2, host="b", state=S.LAUNCHED)
    why = "its host or slot left the job"
    decisions = occupancy.workers_to_stop(t, hs("a:2"), plan, (), 5.0)
    stopping = [
        Report(ev.WorkerStopping(worker=w, host="b", slot=int(w[1]), reason=why))
        for w in ("b0", "b1", "b2")
    ]
    assert decisions == [
        stopping[0],
        *leave_at_commit(["b0"], why, 5.0),
        stopping[1],
        *leave_at_commit(["b1"], why, 5.0),
        stopping[2],
        Stop("b2", why),
    ]
    # A blacklisted host's members are stopped: they may be what is broken.
    assert Stop("b0", why) in occupancy.workers_to_stop(t, hs("a:2"), plan, ("b",), 5.0)


def test_the_last_holders_of_the_state_on_a_blacklisted_host_wait_for_newcomers():
    """Host b is blacklisted (its workers failed: a third SIGKILL from outside) while the
    only running members of the round are there: stopped at once, they would take the
    only copy of the state along (the job fails, no --checkpoint-dir). They leave at
    their commit once newcomers on a hold it, as a world replaced whole does."""
    why = "its host or slot left the job"
    t = table(
        rec("b0", 0, host="b"),
        rec("b1", 1, host="b", state=S.FAILED, exit_code=-9),
        rec("a0", 0, host="a", state=S.LAUNCHED),
    )
    plan = plan_of(23, t["b0"], t["b1"])
    decisions = occupancy.workers_to_stop(t, hs("a:2"), plan, ("b",), 5.0)
    assert decisions == [
        Report(ev.WorkerStopping(worker="b0", host="b", slot=0, reason=why)),
        *leave_at_commit(["b0"], why, 5.0, HANDOFF_WAIT),
    ]
    # A member running elsewhere holds the state too: the blacklisted host's are stopped.
    t["a1"] = rec("a1", 1, host="a")
    plan = plan_of(23, t["b0"], t["a1"])
    assert Stop("b0", why) in occupancy.workers_to_stop(t, hs("a:2"), plan, ("b",), 5.0)


def test_a_round_that_only_grows_an_intact_one_is_a_handover():
    t, plan = two_hosts()
    t["c0"] = rec("c0", 0, host="c")
    step = rounds.plan_round(
        t, plan, Book.start(0), view("a:2,b:2,c:1"), settings("-np", "4", "--max-np", "6"), 11.0
    )
    published = [d for d in step.decisions if isinstance(d, Publish)]
    assert [p.plan.size for p in published] == [5] and published[0].plan.handover


@pytest.mark.parametrize(
    ("current", "latest", "handover", "me", "expected"),
    [
        (1, 1, True, "a0", (True, False)),  # a handover from its own round: defer
        (1, 1, True, "b0", (True, True)),  # ... that leaves it out: it leaves there
        (1, 1, False, "b0", (False, False)),  # an ordinary round: change now
        (1, 2, True, "a0", (True, False)),  # handovers since its round: defer still
        (None, 2, True, "b0", (False, True)),  # a newcomer of round 2, dropped: leave
        (None, None, True, "a0", (False, False)),  # a newcomer: nothing to finish
    ],
)
def test_how_a_worker_takes_a_handover(current, latest, handover, me, expected):
    t, one = two_hosts()
    plans = {1: one, 2: dataclasses.replace(one, round_id=2, handover=True)}
    stay: list[WorkerInfo] = [r.info for r in t.values() if r.host == "a" and r.info]
    after = dataclasses.replace(build_plan(3, stay), handover=handover)
    got = handover_for(after, plans.get(latest), plans.get(current), me)
    assert got == expected


# ----------------------------------------------------------------------------- a world replaced


def test_a_world_replaced_whole_keeps_its_holders_until_the_newcomers_commit():
    """Every member's host left (discovery swapped the hosts): the members leave at a
    commit, but stay planned until rank 0 has committed in a round with the newcomers."""
    old = [rec("a", 0, host="old"), rec("b", 1, host="old")]
    p1 = plan_of(1, *old)
    cfg = settings("--min-np", "2", "-H", "new:2")
    new = [rec("c", 0, host="new", seq=10), rec("d", 1, host="new", seq=11)]
    usable = view("new:2")
    stop = occupancy.workers_to_stop(table(*old), usable.usable, p1, now=0.0)
    assert kinds(stop) == [Report, Leave, Report, Leave]
    assert [d.until for d in stop if isinstance(d, Leave)] == [60.0, 60.0]
    holders = frozenset({"a", "b"})
    leaving = Book(
        RoundBook(0.0),
        hosts=HostBook(leaving=(Departure("a", 60.0), Departure("b", 60.0))),
        progress=ProgressBook(commit_members=holders, step=9),
    )
    gone = [
        dataclasses.replace(r, state=S.STOPPING) for r in old
    ]  # (Leave: counted as stopping, still running and registered)
    t = table(*gone, *new)
    step = rounds.plan_round(t, p1, leaving, usable, cfg, now=1.0)
    grown = only([d for d in step.decisions if isinstance(d, Publish)], Publish).plan
    assert grown.worker_ids == ("a", "b", "c", "d") and grown.handover
    # Round 2 formed; until rank 0 commits in it, the holders stay.
    step = rounds.plan_round(t, grown, leaving, usable, cfg, now=2.0)
    assert not [d for d in step.decisions if isinstance(d, Publish)]
    assert any(isinstance(d, Wait) for d in step.decisions)
    # Once it has, the round without them follows, as a handover.
    committed = reports.progress_reported(
        leaving, 12, 2, progress(), 3.0, commit_round=2, plan=grown
    )
    step = rounds.plan_round(t, grown, committed, usable, cfg, now=3.0)
    last = only([d for d in step.decisions if isinstance(d, Publish)], Publish).plan
    assert last.worker_ids == ("c", "d") and last.handover


def test_holders_with_no_newcomer_get_a_snapshot_before_they_go():
    old = [rec("a", 0, host="old", state=S.STOPPING), rec("b", 1, host="old", state=S.STOPPING)]
    p1 = plan_of(1, *old)
    leaving = Book(
        RoundBook(0.0), hosts=HostBook(leaving=(Departure("a", 60.0), Departure("b", 60.0)))
    )
    step = departures.leaving_due(table(*old), leaving, 61.0, p1, snapshots=True)
    assert kinds(step.decisions) == [SnapshotNow]
    assert step.book.hosts.leaving == () and [d.host for d in step.book.hosts.draining] == ["old"]
    # Without a checkpoint folder they are stopped: the loss is then said loudly.
    step = departures.leaving_due(table(*old), leaving, 61.0, p1, snapshots=False)
    assert kinds(step.decisions) == [Stop, Stop]
