"""The job's rules (``driver.policy``) and the worker lifecycle (``driver.policy.lifecycle``): pure
functions of records, plan, book, hosts, config and time, checked decision by decision.
Every exit rule, every timer and every limit the main loop obeys is here."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

import pytest

from driver import events as ev
from driver import policy
from driver.config import parse_args
from driver.hosts.slots import HostSlots, parse_host_slots
from driver.policy import lifecycle, suspicion
from driver.policy.decisions import (
    Book,
    CountFailure,
    Fail,
    HostLost,
    HostsView,
    Kill,
    Launch,
    Leave,
    Probe,
    Publish,
    Report,
    RetireAgent,
    SnapshotNow,
    Stop,
    StoreHealth,
    Succeed,
    Wait,
)
from driver.policy.lifecycle import WorkerRecord, WorkerState
from driver.policy.planner import build_plan
from rendezvous.schema.rounds import Plan
from rendezvous.schema.workers import FailureRecord, WorkerInfo

pytestmark = pytest.mark.unit  # pure logic: no process, no socket

S = WorkerState


def hs(spec: str) -> tuple[HostSlots, ...]:
    return tuple(parse_host_slots(e, 1) for e in spec.split(",")) if spec else ()


def config(*args: str, **changes):
    cfg = parse_args([*args, "python", "train.py"])
    return dataclasses.replace(cfg, **changes) if changes else cfg


def info(wid: str, host: str = "h", slot: int = 0) -> WorkerInfo:
    return WorkerInfo(worker_id=wid, host=host, slot=slot, pid=1, address=f"{host}:{7000 + slot}")


def rec(
    wid: str,
    slot: int = 0,
    state: WorkerState = S.REGISTERED,
    host: str = "h",
    seq: int = 0,
    since: float = 0.0,
    launched_at: float = 0.0,
    exit_code: int | None = None,
) -> WorkerRecord:
    registered = state is S.REGISTERED
    return WorkerRecord(
        wid,
        host,
        slot,
        launched_at=launched_at,
        state=state,
        since=since,
        info=info(wid, host, slot) if registered else None,
        registered_seq=seq or (slot + 1 if registered else 0),
        exit_code=exit_code,
    )


def table(*records: WorkerRecord) -> dict[str, WorkerRecord]:
    return {r.worker_id: r for r in records}


def plan_of(round_id: int, *records: WorkerRecord) -> Plan:
    return build_plan(round_id, [info(r.worker_id, r.host, r.slot) for r in records])


def view(spec: str = "h:2", **kw) -> HostsView:
    return HostsView(usable=hs(spec), **kw)


def kinds(decisions) -> list[type]:
    return [type(d) for d in decisions]


D = TypeVar("D")


def only(decisions, cls: type[D]) -> D:
    """The one decision, which must be a ``cls``."""
    assert kinds(decisions) == [cls], decisions
    return decisions[0]


# ----------------------------------------------------------------------------- lifecycle


def test_registration_moves_a_worker_in_and_out_of_the_candidates():
    r = WorkerRecord.launched("w", "h", 0, now=1.0)
    assert r.state is S.LAUNCHED and r.since == 1.0 and not r.live
    r = lifecycle.registered(r, info("w"), created_revision=7, now=2.0)
    assert r.state is S.REGISTERED and r.live and r.registered_seq == 7 and r.since == 2.0
    same = lifecycle.registered(r, info("w"), created_revision=7, now=3.0)  # a lease refresh
    assert same.state is S.REGISTERED and same.since == 2.0
    lapsed = lifecycle.unregistered(r, now=4.0)
    assert lapsed.state is S.UNREGISTERED and lapsed.info is None and lapsed.since == 4.0
    back = lifecycle.registered(lapsed, info("w"), created_revision=9, now=5.0)
    assert back.state is S.REGISTERED and back.registered_seq == 9  # registered anew: later
    going = lifecycle.stopping(back, now=6.0)
    assert lifecycle.registered(going, info("w"), 9, 7.0).state is S.STOPPING
    assert lifecycle.unregistered(going, 7.0).state is S.STOPPING


@pytest.mark.parametrize(
    "before, code, after",
    [
        (S.REGISTERED, 0, S.FINISHED),
        (S.REGISTERED, 3, S.FAILED),
        (S.LAUNCHED, -9, S.FAILED),
        (S.STOPPING, 0, S.STOPPED),
        (S.STOPPING, -15, S.STOPPED),
        (S.KILLED, -9, S.FAILED),
        (S.CHAOS_KILLED, -9, S.FAILED),
        (S.UNREGISTERED, 1, S.FAILED),
    ],
)
def test_exit_states(before, code, after):
    done = lifecycle.exited(rec("w", state=before), code, now=5.0)
    assert done.state is after and done.exit_code == code and done.info is None
    assert not done.state.running and not done.state.active


def test_running_and_active_states():
    assert {s for s in S if s.active} == {S.LAUNCHED, S.REGISTERED, S.UNREGISTERED}
    assert {s for s in S if not s.running} == {S.FINISHED, S.FAILED, S.STOPPED}
    assert lifecycle.killed(rec("w"), 1.0).state is S.KILLED
    assert lifecycle.killed(rec("w"), 1.0, chaos=True).state is S.CHAOS_KILLED


def test_live_infos_in_registration_order():
    t = table(
        rec("a", 0, seq=5),
        rec("b", 1, seq=2),
        rec("c", 2, state=S.STOPPING),
        rec("d", 3, state=S.LAUNCHED),
    )
    assert [i.worker_id for i in policy.live_infos(t)] == ["b", "a"]


# ----------------------------------------------------------------------------- outcome


def test_outcome_success_when_every_member_exited_0():
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(3, a, b)
    done = table(
        rec("a", 0, state=S.FINISHED, exit_code=0), rec("b", 1, state=S.FINISHED, exit_code=0)
    )
    assert policy.outcome(done, p, Book(0.0, resets=2)) == Succeed(round=3, size=2, resets=2)


def test_outcome_waits_while_members_run_or_all_failed():
    p = plan_of(1, rec("a", 0), rec("b", 1))
    running = table(rec("a", 0, state=S.FINISHED, exit_code=0), rec("b", 1))
    assert policy.outcome(running, p, Book(0.0)) is None
    failed = table(
        rec("a", 0, state=S.FAILED, exit_code=1), rec("b", 1, state=S.FAILED, exit_code=-9)
    )
    assert policy.outcome(failed, p, Book(0.0)) is None  # re-forming handles it


def test_outcome_fails_when_some_finished_and_others_failed():
    p = plan_of(4, rec("a", 0), rec("b", 1))
    mixed = table(
        rec("a", 0, state=S.FINISHED, exit_code=0), rec("b", 1, state=S.FAILED, exit_code=3)
    )
    decision = policy.outcome(mixed, p, Book(0.0))
    assert isinstance(decision, Fail)
    assert decision.reason == (
        "worker rank 1 (b) of the final round 4 exited with 3 after other workers had finished"
    )


def test_a_stopped_worker_did_not_finish_whatever_its_code():
    stopped = rec("b", 1, state=S.STOPPED, exit_code=0)
    assert policy.finish_code(stopped) == -1
    assert policy.finish_code(rec("b", state=S.STOPPED, exit_code=-15)) == -15
    assert policy.finish_code(rec("b", state=S.FINISHED, exit_code=0)) == 0
    assert policy.finish_code(rec("b")) is None
    p = plan_of(1, rec("a", 0), rec("b", 1))
    decision = policy.outcome(
        table(rec("a", 0, state=S.FINISHED, exit_code=0), stopped), p, Book(0.0)
    )
    assert isinstance(decision, Fail) and "exited with -1" in decision.reason


def test_outcome_before_any_round():
    assert policy.outcome({}, None, Book(0.0)) is None
    done = Book(0.0, done_slots=frozenset({("h", 0)}))
    gone = table(dataclasses.replace(rec("a", 0, state=S.FINISHED, exit_code=0), registered_seq=3))
    assert policy.outcome(gone, None, done) == Fail("workers exited before the first round formed")
    never = table(rec("a", 0, state=S.FINISHED, exit_code=0))  # never registered
    decision = policy.outcome(never, None, done)
    assert isinstance(decision, Fail) and "call elastic.init()" in decision.reason
    assert policy.outcome(table(rec("b", 1)), None, done) is None  # one still runs


# ----------------------------------------------------------------------------- exits


def test_a_member_finishing_starts_the_finish_grace():
    a = rec("a", 0)
    p = plan_of(1, a)
    done, (decisions, book) = policy.worker_exited(a, 0, p, Book(0.0), now=7.0)
    assert done.state is S.FINISHED
    assert decisions == (Report(ev.WorkerExited(worker="a", host="h", slot=0, code=0, rank=0)),)
    assert book.done_slots == {("h", 0)} and book.member_finished_at == 7.0
    assert book.change_at == 7.0


def test_a_member_whose_training_returned_marks_the_training_done():
    a = rec("a", 0)
    p = plan_of(1, a, rec("b", 1))
    _, (_, book) = policy.worker_exited(a, 0, p, Book(0.0), now=7.0, trained_to_end=True)
    assert book.training_done
    # An exit 0 without the marker (a worker leaving early) starts only the finish grace,
    # and so does a non-member's, marker or not.
    _, (_, book) = policy.worker_exited(a, 0, p, Book(0.0), now=7.0)
    assert not book.training_done
    _, (_, book) = policy.worker_exited(rec("z", 3), 0, p, Book(0.0), now=7.0, trained_to_end=True)
    assert not book.training_done


def test_a_stopped_worker_is_no_failure():
    going = rec("a", 0, state=S.STOPPING)
    done, (decisions, book) = policy.worker_exited(going, -15, None, Book(0.0), now=3.0)
    assert done.state is S.STOPPED
    assert decisions == (Report(ev.WorkerStopped(worker="a", host="h", slot=0, code=-15)),)
    assert book == Book(0.0)


def test_a_failure_counts_against_host_and_streak_unless_chaos():
    a = rec("a", 1)
    p = plan_of(2, rec("z", 0), a)
    _, (decisions, book) = policy.worker_exited(a, 1, p, Book(0.0), now=3.0)
    assert decisions == (
        Report(
            ev.WorkerFailed(
                worker="a", host="h", slot=1, code=1, rank=1, in_round=True, chaos=False
            )
        ),
        CountFailure("h", 1),
    )
    assert book.change_at == 3.0
    victim = rec("a", 1, state=S.CHAOS_KILLED)
    _, (decisions, _) = policy.worker_exited(victim, -9, p, Book(0.0), now=3.0)
    assert only(decisions, Report).event == ev.WorkerFailed(
        worker="a", host="h", slot=1, code=-9, rank=1, in_round=True, chaos=True
    )


def test_failure_streak_limit():
    book = Book(0.0)
    for _ in range(policy.FAILURE_STREAK_MIN):
        decisions, book = policy.count_failure(book, available_slots=2, code=4)
        assert decisions == ()
    decisions, book = policy.count_failure(book, available_slots=2, code=4)
    assert book.failure_streak == 11
    assert decisions == (
        Fail(
            "11 workers failed in a row without a round forming (last exit: "
            "exit 4); see the worker output above"
        ),
    )
    # Three per slot when that is more: 15 with 5 slots.
    decisions, _ = policy.count_failure(Book(0.0, failure_streak=14), available_slots=5, code=1)
    assert decisions == ()
    decisions, _ = policy.count_failure(Book(0.0, failure_streak=15), available_slots=5, code=1)
    assert only(decisions, Fail).reason.startswith("16 workers failed")


def test_publishing_a_round_ends_the_streak():
    t = table(rec("a", 0), rec("b", 1))
    decisions, book = policy.plan_round(
        t, None, Book(0.0, failure_streak=7), view(), config("-np", "2"), now=1.0
    )
    assert kinds(decisions) == [Publish] and book.failure_streak == 0


def test_a_round_with_no_member_of_the_round_before_says_the_state_is_lost(tmp_path):
    dead = rec("a", 0, state=S.FAILED, exit_code=-9)
    t, before = table(dead, rec("b", 0)), plan_of(1, dead)
    committed = Book(0.0, progress_step=120)
    # Nothing was ever committed (a script without State): nothing to lose.
    decisions, _ = policy.plan_round(t, before, Book(0.0), view(), config("-np", "1"), 1.0)
    assert kinds(decisions) == [Publish]
    # Committed, no snapshot: the job ends, naming the step lost and the way out.
    decisions, _ = policy.plan_round(t, before, committed, view(), config("-np", "1"), 1.0)
    reason = only(decisions, Fail).reason
    assert "state was lost" in reason and "step 120" in reason and "--checkpoint-dir" in reason
    assert "--on-state-lost restart" in reason
    # Asked to start over: it does, and says so.
    cfg = config("-np", "1", "--on-state-lost", "restart")
    decisions, _ = policy.plan_round(t, before, committed, view(), cfg, 1.0)
    assert kinds(decisions) == [Publish, Report]
    assert decisions[1] == Report(ev.StateLost(round=2, previous=1, step=120))
    # A snapshot the new round can read carries the state on: nothing lost.
    for where in ("", "h"):
        book = dataclasses.replace(committed, snapshots=((where, 100),))
        decisions, _ = policy.plan_round(t, before, book, view(), config("-np", "1"), 1.0)
        assert kinds(decisions) == [Publish]
    # One on the disk of a host the new round does not run on does not.
    book = dataclasses.replace(committed, snapshots=(("other-host", 100),))
    cfg = config("-np", "1", "--checkpoint-dir", str(tmp_path))
    decisions, _ = policy.plan_round(t, before, book, view(), cfg, 1.0)
    assert "snapshots are on hosts the new round does not run on (other-host)" in (
        only(decisions, Fail).reason
    )
    # A survivor carries the state: nothing to say.
    cfg = config("-np", "2", "--min-np", "1")
    t = table(dead, rec("b", 1), rec("c", 0))
    decisions, _ = policy.plan_round(t, plan_of(1, dead, rec("b", 1)), Book(0.0), view(), cfg, 1.0)
    assert only(decisions, Publish).plan.worker_ids == ("b", "c")


# ----------------------------------------------------------------------------- first round


def test_first_round_waits_for_np_within_the_start_timeout():
    cfg = config("-np", "2", "--start-timeout", "30")
    t = table(rec("a", 0), rec("b", 1, state=S.LAUNCHED))
    decisions, book = policy.plan_round(t, None, Book(0.0, np_registered_at=5.0), view(), cfg, 10.0)
    assert decisions == (Wait(30.0, "-np workers"),) and book.np_registered_at is None
    decisions, _ = policy.plan_round(t, None, Book(0.0), view(), cfg, 30.5)
    assert decisions == (Fail("only 1 of 2 workers registered within --start-timeout 30s"),)


def test_first_round_grace_for_the_rest_of_those_launched():
    cfg = config("-np", "2", "-H", "h:3", "--min-np", "2")
    t = table(rec("a", 0), rec("b", 1), rec("c", 2, state=S.LAUNCHED))
    decisions, book = policy.plan_round(t, None, Book(0.0), view("h:3"), cfg, now=4.0)
    assert book.np_registered_at == 4.0
    assert decisions == (Wait(4.0 + policy.FIRST_ROUND_GRACE, "the rest of the first workers"),)
    decisions, _ = policy.plan_round(t, None, book, view("h:3"), cfg, now=4.5)
    assert kinds(decisions) == [Wait]
    decisions, book = policy.plan_round(t, None, book, view("h:3"), cfg, now=5.1)
    assert only(decisions, Publish).plan.worker_ids == ("a", "b")
    assert book.resets == 0  # the first round is no reset


def test_first_round_at_once_when_every_launched_worker_registered():
    t = table(rec("a", 0), rec("b", 1))
    decisions, _ = policy.plan_round(
        t, None, Book(0.0, change_at=0.25), view(), config("-np", "2"), now=1.0
    )
    assert decisions == (Publish(build_plan(1, [info("a", "h", 0), info("b", "h", 1)]), 0.75),)


# ----------------------------------------------------------------------------- later rounds


def test_finish_grace_holds_every_round():
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(1, a, b)
    t = table(a, rec("b", 1, state=S.FINISHED, exit_code=0))
    book = Book(0.0, member_finished_at=10.0, done_slots=frozenset({("h", 1)}))
    cfg = config("-np", "2", "--min-np", "1")
    decisions, _ = policy.plan_round(t, p, book, view(), cfg, now=11.0)
    assert decisions == (Wait(10.0 + policy.FINISH_GRACE, "the others to finish"),)
    decisions, book = policy.plan_round(t, p, book, view(), cfg, now=12.5)
    assert only(decisions, Publish).plan.worker_ids == ("a",)
    assert book.resets == 0  # a round for stragglers after a finish is no reset


def test_no_round_and_no_launch_once_training_is_done():
    # However long the others take to finish, a done training never re-forms: a new
    # world would be handed a finished job (the FINISH_GRACE race under load).
    a = rec("a", 0)
    p = plan_of(1, a, rec("b", 1))
    t = table(a, rec("b", 1, state=S.FINISHED, exit_code=0))
    book = Book(0.0, member_finished_at=10.0, training_done_at=0.0)
    cfg = config("-np", "2", "--min-np", "1")
    decisions, after = policy.plan_round(t, p, book, view(), cfg, now=10.0 + 60.0)
    assert decisions == () and after == book
    assert policy.slots_to_fill(t, hs("h:2"), book, cfg) == []


def test_join_batch_window_holds_growth_while_the_round_works():
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(1, a)
    cfg = config("-np", "1", "-H", "h:3", "--min-np", "1")
    young = rec("c", 2, state=S.LAUNCHED, launched_at=9.0)
    t = table(a, rec("b", 1, launched_at=8.0), young)
    decisions, _ = policy.plan_round(t, p, Book(0.0), view("h:3"), cfg, now=10.0)
    assert decisions == (Wait(9.0 + policy.JOIN_BATCH_WINDOW, "new workers to register"),)
    decisions, _ = policy.plan_round(t, p, Book(0.0), view("h:3"), cfg, now=12.5)
    assert only(decisions, Publish).plan.worker_ids == ("a", "b")
    # A broken round never waits: its survivors are idle.
    broken = table(rec("a", 0, state=S.FAILED, exit_code=1), rec("b", 1, launched_at=8.0), young)
    decisions, _ = policy.plan_round(broken, plan_of(1, a, b), Book(0.0), view("h:3"), cfg, 10.0)
    assert only(decisions, Publish).plan.worker_ids == ("b",)


def test_reset_limit():
    cfg = config("-np", "2", "--min-np", "1", "--reset-limit", "1")
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(1, a, b)
    t = table(a, rec("b", 1, state=S.FAILED, exit_code=1))
    decisions, book = policy.plan_round(t, p, Book(0.0), view(), cfg, now=1.0)
    p2 = only(decisions, Publish).plan
    assert book.resets == 1
    t = table(
        rec("a", 0, state=S.FAILED, exit_code=1),
        rec("b", 1, state=S.FAILED, exit_code=1),
        rec("c", 1, seq=9),
    )
    decisions, book = policy.plan_round(t, p2, book, view(), cfg, now=2.0)
    assert decisions == (Fail("reset limit exceeded: the job re-formed 2 times (--reset-limit 1)"),)


def test_round_formation_time_counts_from_the_first_change():
    cfg = config("-np", "2", "--min-np", "1")
    a, b = rec("a", 0), rec("b", 1)
    t = table(a, rec("b", 1, state=S.FAILED, exit_code=-9))
    decisions, book = policy.plan_round(
        t, plan_of(1, a, b), Book(0.0).changed(3.0).changed(3.5), view(), cfg, now=3.25
    )
    assert only(decisions, Publish).seconds == 0.25 and book.change_at is None


# ----------------------------------------------------------------------------- broken rounds


def test_broken_round_clock_report_and_elastic_timeout():
    cfg = config("-np", "2", "--elastic-timeout", "5")
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(2, a, b)
    t = table(a, rec("b", 1, state=S.FAILED, exit_code=-9))
    decisions, book = policy.plan_round(t, p, Book(0.0), view(), cfg, now=10.0)
    assert book.broken_since == 10.0 and not book.waiting_reported
    assert decisions == (
        Wait(10.0 + policy.WAITING_REPORT_AFTER, "a round to re-form"),
        Wait(15.0, "--elastic-timeout"),
    )
    decisions, book = policy.plan_round(t, p, book, view(), cfg, now=11.5)
    assert decisions == (
        Report(
            ev.Waiting(what="round 2 lost workers; waiting for 2 to re-form (have 1)", waited=1.5)
        ),
        Wait(15.0, "--elastic-timeout"),
    )
    assert book.waiting_reported
    decisions, book = policy.plan_round(t, p, book, view(), cfg, now=12.0)
    assert decisions == (Wait(15.0, "--elastic-timeout"),)  # reported once
    decisions, _ = policy.plan_round(t, p, book, view(blacklisted=("x",)), cfg, now=15.5)
    assert decisions == (
        Fail(
            "no round of at least 2 workers could form within "
            "--elastic-timeout 5s (have 1; blacklisted: x)"
        ),
    )


def test_a_lapse_that_ends_resets_the_broken_clock():
    cfg = config("-np", "2")
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(1, a, b)
    decisions, book = policy.plan_round(
        table(a, b), p, Book(0.0, broken_since=3.0), view(), cfg, now=4.0
    )
    assert decisions == () and book.broken_since is None


def test_script_failing_in_two_rounds_in_a_row_ends_the_job():
    a, b = rec("a", 0), rec("b", 1)
    failed = table(
        rec("a", 0, state=S.FAILED, exit_code=3), rec("b", 1, state=S.FAILED, exit_code=3)
    )
    book, fail = policy.script_fails(failed, plan_of(1, a, b), Book(0.0))
    assert fail is None and book.all_failed_rounds == {1}
    book, fail = policy.script_fails(failed, plan_of(2, a, b), book)
    assert fail == Fail(
        "every worker of rounds 1 and 2 exited with an error (codes [3]): the "
        "training script fails; see the worker output above"
    )
    # Not in a row, a signal, or a stop: replaced as usual.
    assert (
        policy.script_fails(failed, plan_of(4, a, b), Book(0.0, all_failed_rounds=frozenset({2})))[
            1
        ]
        is None
    )
    after_one = Book(0.0, all_failed_rounds=frozenset({1}))
    killed = table(
        rec("a", 0, state=S.FAILED, exit_code=3), rec("b", 1, state=S.FAILED, exit_code=-9)
    )
    assert policy.script_fails(killed, plan_of(2, a, b), after_one) == (after_one, None)
    stopped = table(
        rec("a", 0, state=S.FAILED, exit_code=3), rec("b", 1, state=S.STOPPED, exit_code=3)
    )
    assert policy.script_fails(stopped, plan_of(2, a, b), after_one) == (after_one, None)


def test_plan_round_applies_the_script_rule_to_a_broken_round():
    cfg = config("-np", "2")
    a, b = rec("a", 0), rec("b", 1)
    failed = table(
        rec("a", 0, state=S.FAILED, exit_code=3), rec("b", 1, state=S.FAILED, exit_code=3)
    )
    decisions, _ = policy.plan_round(
        failed, plan_of(2, a, b), Book(0.0, all_failed_rounds=frozenset({1})), view(), cfg, 1.0
    )
    assert "the training script fails" in only(decisions, Fail).reason


# ----------------------------------------------------------------------------- workers


def test_reregister_grace_then_kill():
    lapsed = rec("a", 0, state=S.UNREGISTERED, since=5.0)
    t = table(lapsed, rec("b", 1))
    assert policy.workers_to_kill(t, now=5.0 + policy.REREGISTER_GRACE) == []
    assert policy.lapse_waits(t) == [Wait(5.0 + policy.REREGISTER_GRACE, "a to register again")]
    assert policy.workers_to_kill(t, now=15.5) == [
        Kill("a", "its registration lapsed and it did not register again within 10s")
    ]


def test_displaced_workers_are_stopped_once():
    t = table(
        rec("a", 0),
        rec("b", 1, state=S.LAUNCHED),
        rec("c", 2, host="gone"),
        rec("d", 0, host="gone", state=S.STOPPING),
        rec("e", 1, host="gone", state=S.KILLED),
    )
    why = "its host or slot left the job"
    assert policy.workers_to_stop(t, hs("h:1")) == [
        Report(ev.WorkerStopping(worker="b", host="h", slot=1, reason=why)),
        Stop("b", why),
        Report(ev.WorkerStopping(worker="c", host="gone", slot=2, reason=why)),
        Stop("c", why),
    ]


def test_the_agent_of_a_removed_idle_host_is_retired():
    # "gone" left discovery and runs nothing; "cool" is blacklisted, not listed (it may
    # come back after its cooldown); "h" is listed; "busy" still runs a stopping worker,
    # "shard" a process its agent reports running (a ps shard).
    hosts = view("h:1", blacklisted=("cool",), listed=("h", "cool2"))
    agents = ("h", "gone", "cool", "cool2", "busy", "shard")
    t = table(rec("a", 0), rec("s", 0, host="busy", state=S.STOPPING))
    t["x"] = rec("x", 0, host="gone", state=S.STOPPED)  # its exit was reported
    retire = policy.agents_to_retire(agents, ("shard",), t, hosts)
    assert retire == [RetireAgent("gone")]
    # Once the stopping worker's exit is reported, its host's agent goes too.
    t["s"] = rec("s", 0, host="busy", state=S.STOPPED)
    assert policy.agents_to_retire(agents, (), t, hosts) == [
        RetireAgent("busy"),
        RetireAgent("gone"),
        RetireAgent("shard"),
    ]
    # A host discovery lists again keeps its agent.
    again = view("h:1,gone:1,busy:1,shard:1", blacklisted=("cool",), listed=("cool2",))
    assert policy.agents_to_retire(agents, (), t, again) == []


def test_free_slots_are_filled_but_not_finished_ones():
    cfg = config("-np", "3")
    # A worker being stopped still holds its slot; an exited one does not.
    t = table(
        rec("a", 0, host="localhost"),
        rec("b", 1, host="localhost", state=S.STOPPING),
        rec("c", 2, host="localhost", state=S.FAILED, exit_code=1),
    )
    assert policy.slots_to_fill(t, hs("localhost:3"), Book(0.0), cfg) == [Launch("localhost", 2)]
    t = table(
        rec("a", 0, host="localhost"), rec("c", 2, host="localhost", state=S.FAILED, exit_code=1)
    )
    assert policy.slots_to_fill(t, hs("localhost:3"), Book(0.0), cfg) == [
        Launch("localhost", 1),
        Launch("localhost", 2),
    ]
    done = Book(0.0, done_slots=frozenset({("localhost", 1)}))
    assert policy.slots_to_fill(t, hs("localhost:3"), done, cfg) == [Launch("localhost", 2)]
    capped = dataclasses.replace(cfg, max_np=1)
    assert policy.slots_to_fill(t, hs("localhost:3"), Book(0.0), capped) == []


def test_an_accused_member_silent_itself_is_killed_after_the_confirm_window():
    """A stopped or hung member cannot report: its peers' word is confirmed by its own
    silence for CONFIRM_WINDOW, then it is killed."""
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(3, a, b)
    t = table(a, b, rec("c", 2, state=S.STOPPING))
    window = suspicion.CONFIRM_WINDOW

    def report(suspect, round_id, reporter="a"):
        return FailureRecord(reporter, round_id, "timeout", suspect)

    said = Report(ev.FailureReported(reporter="a", round=3, reason="timeout", suspect="b"))
    decisions, book = suspicion.failure_reported(t, p, Book(0.0), report("b", 3), 10.0)
    assert decisions == (said,) and book.reporters == {"a"}
    assert [w for w, *_ in book.accused] == ["b"]
    waiting, book = suspicion.accusations_due(t, book, 10.0 + window / 2)
    assert kinds(waiting) == [Wait] and len(book.accused) == 1
    killed, book = suspicion.accusations_due(t, book, 10.0 + window)
    (kill,) = killed
    assert isinstance(kill, Kill) and kill.worker_id == "b"
    assert "reported nothing itself" in kill.reason and book.accused == ()
    for other in (report("b", 2), report("c", 3), report("zz", 3), report(None, 3)):
        assert suspicion.failure_reported(t, p, Book(0.0), other, 10.0)[1].accused == ()
    assert suspicion.failure_reported(t, None, Book(0.0), report("b", 3), 10.0)[1] == Book(0.0)


def test_two_live_members_blaming_each_other_are_both_spared():
    """Healthy workers kept apart (a crowded listener) blame each other: each report
    shows its reporter alive, so nobody holding the newest commit is killed on it."""
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(3, a, b)
    t = table(a, b)
    a_blames_b = FailureRecord("a", 3, "did not connect", "b")
    b_blames_a = FailureRecord("b", 3, "did not connect", "a")
    _, book = suspicion.failure_reported(t, p, Book(0.0), a_blames_b, 10.0)
    _, book = suspicion.failure_reported(t, p, book, b_blames_a, 10.1)
    assert book.reporters == {"a", "b"} and book.accused == ()
    assert suspicion.accusations_due(t, book, 60.0)[0] == ()
    assert book.new_round().reporters == frozenset()


def test_a_silent_member_gets_its_host_probed_once_never_killed_on_that_word():
    a, b = rec("a", 0, host="h1"), rec("b", 1, host="h2")
    p = plan_of(3, a, b)
    t = table(a, b, rec("c", 2, host="h2", state=S.STOPPING))

    def silent(suspect, round_id=3, reporter="a"):
        return FailureRecord(reporter, round_id, "silent for 0.9s", suspect, silent=True)

    decisions, book = suspicion.silence_reported(t, p, Book(0.0), silent("b"))
    assert decisions[1:] == (Probe("h2", "h2:7001"),) and book.probing == {"h2"}
    assert not any(isinstance(d, Kill) for d in decisions)
    # The other neighbour says the same while the probe runs: one probe per host.
    again, book = suspicion.silence_reported(t, p, book, silent("b", reporter="c"))
    assert kinds(again) == [Report] and book.probing == {"h2"}
    for report in (silent("b", round_id=2), silent("c"), silent("zz"), silent(None)):
        assert kinds(suspicion.silence_reported(t, p, Book(0.0), report)[0]) == [Report]
    assert kinds(suspicion.silence_reported(t, None, Book(0.0), silent("b"))[0]) == [Report]


def test_an_unreachable_host_is_lost_with_every_worker_running_there():
    a, b = rec("a", 0, host="h1"), rec("b", 1, host="h2")
    t = table(
        a, b, rec("c", 2, host="h2", state=S.UNREGISTERED), rec("d", 3, host="h2", state=S.FAILED)
    )
    probing = Book(0.0, probing=frozenset({"h2", "h3"}))
    answered, book = suspicion.probe_answered(t, probing, "h2", True, "accepted")
    assert answered == () and book.probing == {"h3"}
    lost, book = suspicion.probe_answered(t, probing, "h2", False, "no answer within 0.5s")
    assert book.probing == {"h3"}
    assert lost == (
        Report(ev.HostUnreachable("h2", "no answer within 0.5s", ["b", "c"])),
        HostLost("h2", "no answer within 0.5s"),
        Kill("b", "its host h2 is unreachable (no answer within 0.5s)"),
        Kill("c", "its host h2 is unreachable (no answer within 0.5s)"),
    )


def test_chaos_never_takes_the_round_below_min_np():
    """The world the chaos tests is one the user declared survivable: never below
    --min-np, in a round already shrunk too, and in a job of fixed size never more than
    one worker short."""
    a, b, c, d = rec("a", 0), rec("b", 1), rec("c", 2), rec("d", 3)
    p = plan_of(1, a, b, c, d)
    full, one_down = table(a, b, c, d), table(a, b, c, rec("d", 3, state=S.CHAOS_KILLED))
    two_down = table(a, b, rec("c", 2, state=S.FAILED), rec("d", 3, state=S.CHAOS_KILLED))
    # -np 4 --min-np 2: down to 2, never to 1.
    assert policy.chaos_candidates(one_down, p, Book(0.0), min_np=2, np=4) == ["a", "b", "c"]
    assert policy.chaos_candidates(two_down, p, Book(0.0), min_np=2, np=4) == []
    # -np 3 --min-np 2, a round already down to 2: its size is no floor.
    shrunk = plan_of(2, a, b)
    assert policy.chaos_candidates(table(a, b), shrunk, Book(0.0), min_np=2, np=3) == []
    assert policy.chaos_candidates(table(a, b, c), plan_of(3, a, b, c), Book(0.0), 2, 3) == [
        "a",
        "b",
        "c",
    ]
    # -np 4 (min 4): one short at a time, while the round is whole.
    assert policy.chaos_candidates(full, p, Book(0.0), min_np=4, np=4) == ["a", "b", "c", "d"]
    assert policy.chaos_candidates(one_down, p, Book(0.0), min_np=4, np=4) == []
    # -np 1: its only worker holds the state: never, unless asked.
    solo = plan_of(1, a)
    assert policy.chaos_candidates(table(a), solo, Book(0.0), min_np=1, np=1) == []
    assert policy.chaos_candidates(table(a), solo, Book(0.0), 1, 1, below_min_np=True) == ["a"]
    assert policy.chaos_candidates(two_down, p, Book(0.0), 2, 4, below_min_np=True) == ["a", "b"]
    assert [policy.chaos_floor(m, n) for m, n in [(2, 3), (2, 2), (1, 1), (3, 8)]] == [2, 1, 1, 3]


def test_chaos_picks_active_members_and_spares_the_end():
    a, b, c = rec("a", 0), rec("b", 1), rec("c", 2)
    p = plan_of(1, a, b, c)
    t = table(a, rec("b", 1, state=S.CHAOS_KILLED), c)
    assert policy.chaos_candidates(t, p, Book(0.0), min_np=1, np=3) == ["a", "c"]
    done = Book(0.0, done_slots=frozenset({("h", 2)}))
    assert policy.chaos_candidates(t, p, done, min_np=1, np=3) == []
    # A worker's training returned (its finish record), though none has exited yet.
    returned = Book(0.0, training_done_at=5.0)
    assert policy.chaos_candidates(t, p, returned, min_np=1, np=3) == []
    assert policy.chaos_candidates(t, None, Book(0.0), min_np=1, np=3) == []
    assert policy.chaos_kill(c, p, pid=77, kills=2) == [
        Report(ev.ChaosKill(worker="c", host="h", slot=2, rank=2, pid=77, kill=2)),
        Kill("c", "chaos", chaos=True),
    ]


# ----------------------------------------------------------------------------- hosts


def test_all_hosts_blacklisted_waits_for_a_cooldown_within_the_limit():
    cfg = config("-np", "1", "--start-timeout", "20", "--elastic-timeout", "30")
    gone = table(rec("a", 0, state=S.FAILED, exit_code=1))
    out = HostsView(usable=(), blacklisted=("h",), all_blacklisted=True, next_release=15.0)
    assert policy.hosts_rule(gone, None, Book(0.0), out, cfg, now=5.0) == [
        Wait(15.0, "a blacklisted host to come back")
    ]
    late = dataclasses.replace(out, next_release=25.0)
    assert policy.hosts_rule(gone, None, Book(0.0), late, cfg, now=5.0) == [
        Fail(
            "every host is blacklisted after repeated worker failures (h) and none comes "
            "back within --start-timeout"
        )
    ]
    p = plan_of(1, rec("a", 0))
    assert policy.hosts_rule(gone, p, Book(0.0, broken_since=0.0), late, cfg, now=5.0) == [
        Wait(25.0, "a blacklisted host to come back")
    ]
    later = dataclasses.replace(out, next_release=31.0)
    decisions = policy.hosts_rule(gone, p, Book(0.0, broken_since=0.0), later, cfg, now=5.0)
    assert "--elastic-timeout" in only(decisions, Fail).reason
    never = dataclasses.replace(out, next_release=None)
    assert kinds(policy.hosts_rule(gone, p, Book(0.0), never, cfg, now=5.0)) == [Fail]
    # A worker still running (its host's cooldown is not its end): no verdict yet.
    assert policy.hosts_rule(table(rec("b", 0)), p, Book(0.0), never, cfg, now=5.0) == []


# ----------------------------------------------------------------------------- wake-up


def test_next_wakeup_is_the_earliest_wait_within_bounds():
    assert policy.next_wakeup([], now=0.0) == policy.MAX_SLEEP
    waits = [Wait(10.4, "x"), Wait(10.2, "y"), Wait(30.0, "z")]
    assert policy.next_wakeup(waits, now=10.0) == pytest.approx(0.2)
    assert policy.next_wakeup(waits, now=11.0) == policy.MIN_SLEEP  # overdue: at once
    assert policy.next_wakeup([Wait(50.0, "far")], now=0.0) == policy.MAX_SLEEP


# ----------------------------------------------------------------------------- launch failures


def failed_event(decisions) -> ev.WorkerFailed:
    """The ``WorkerFailed`` the first decision reports."""
    event = only(decisions[:1], Report).event
    assert isinstance(event, ev.WorkerFailed), event
    return event


def progress_event(decisions) -> ev.Progress:
    """The ``Progress`` the first decision reports."""
    event = only(decisions[:1], Report).event
    assert isinstance(event, ev.Progress), event
    return event


def test_a_program_that_cannot_start_ends_the_job_before_anything_ran():
    decisions = policy.launch_failed(
        "h-0-1", "h", 0, "cannot start './nope': No such file or directory", None, False, True
    )
    assert decisions == [
        Report(
            ev.WorkerFailed(
                worker="h-0-1",
                host="h",
                slot=0,
                code=None,
                reason="launch failed: cannot start './nope': No such file or directory",
            )
        ),
        Fail("cannot start './nope': No such file or directory"),
    ]


@pytest.mark.parametrize("any_registered, permanent", [(True, True), (False, False)])
def test_other_launch_failures_count_against_host_and_streak(any_registered, permanent):
    reason = "cannot start 'python': Resource temporarily unavailable"
    decisions = policy.launch_failed("w", "h", 1, reason, None, any_registered, permanent)
    assert kinds(decisions) == [Report, CountFailure]
    assert decisions[1] == CountFailure("h", None, reason)
    counted, _ = policy.count_failure(Book(0.0, failure_streak=10), 2, None, reason)
    assert only(counted, Fail).reason == (
        f"11 workers failed in a row without a round forming ({reason}); "
        "see the worker output above"
    )


@pytest.mark.parametrize("code, says", [(127, "command not found"), (126, "not executable")])
def test_a_shell_that_cannot_run_the_command_is_a_launch_failure(code, says):
    """Over ssh a missing program is the remote shell's 126/127, before any registration."""
    never = rec("a", 0, state=S.LAUNCHED)
    done, (decisions, _) = policy.worker_exited(
        never, code, None, Book(0.0), 2.0, command=("./nope", "x"), any_registered=False
    )
    assert done.state is S.FAILED
    reason = only(decisions[1:], Fail).reason
    assert reason.startswith(f"cannot start './nope' on h: exit {code} before it registered")
    assert says in reason and failed_event(decisions).reason == f"launch failed: {reason}"
    # Once some worker of the job ran, it counts instead (a host may lack the program).
    _, (decisions, _) = policy.worker_exited(
        never, code, None, Book(0.0), 2.0, command=("./nope",), any_registered=True
    )
    assert kinds(decisions) == [Report, CountFailure]
    # A worker that registered and then exits 127 is an ordinary failure.
    _, (decisions, _) = policy.worker_exited(
        rec("b", 1), code, None, Book(0.0), 2.0, command=("./nope",), any_registered=False
    )
    assert decisions[1] == CountFailure("h", code) and failed_event(decisions).reason is None


def test_a_worker_the_driver_killed_says_who_and_why():
    hung = lifecycle.killed(rec("a", 1), 3.0, reason="unresponsive (reported by its peers)")
    p = plan_of(2, rec("z", 0), rec("a", 1))
    done, (decisions, _) = policy.worker_exited(hung, -9, p, Book(0.0), now=4.0)
    event = failed_event(decisions)
    assert event.reason == "killed by the driver: unresponsive (reported by its peers)"
    assert str(event) == (
        "worker [1] h:1 failed (killed by SIGKILL): "
        "killed by the driver: unresponsive (reported by its peers)"
    )
    assert decisions[1] == CountFailure("h", -9) and not done.died_on_its_own


# ----------------------------------------------------------------------------- end failures


def test_every_member_failing_after_a_worker_finished_ends_the_job():
    """A worker finished in round 1; round 2 (the stragglers) all failed: nobody holds the
    state, so a replacement would start over after the work was done."""
    p = plan_of(2, rec("b", 1))
    t = table(rec("a", 0, state=S.FINISHED, exit_code=0), rec("b", 1, state=S.FAILED, exit_code=-6))
    done = Book(0.0, done_slots=frozenset({("h", 0)}))
    assert policy.outcome(t, p, done) == Fail(
        "worker rank 0 (b) of the final round 2 exited with -6 after other workers had finished"
    )
    assert policy.outcome(t, p, Book(0.0)) is None  # no finish yet: replaced as usual


def test_rounds_of_workers_dying_on_their_own_end_the_job_after_the_limit():
    cfg = config("-np", "2")
    aborted = table(
        rec("a", 0, state=S.FAILED, exit_code=-6), rec("b", 1, state=S.FAILED, exit_code=-6)
    )
    a, b = rec("a", 0), rec("b", 1)
    book = Book(0.0)
    for round_id in range(1, policy.LOST_ROUNDS_LIMIT):
        book, fail = policy.rounds_lost(aborted, plan_of(round_id, a, b), book)
        assert fail is None
    assert book.lost_rounds == frozenset(range(1, policy.LOST_ROUNDS_LIMIT))
    decisions, book = policy.plan_round(
        aborted, plan_of(policy.LOST_ROUNDS_LIMIT, a, b), book, view(), cfg, now=1.0
    )
    assert only(decisions, Fail).reason == (
        "every worker of rounds 1 to 3 died (killed by SIGABRT) with no survivor to hand "
        "the training state on: the job started over 3 times in a row; see the worker "
        "output above"
    )
    # Not in a row, or a member the driver (or the chaos) killed: replaced as usual.
    gap = Book(0.0, lost_rounds=frozenset({1, 3}))
    assert policy.rounds_lost(aborted, plan_of(4, a, b), gap)[1] is None
    killed = table(
        rec("a", 0, state=S.FAILED, exit_code=-6),
        lifecycle.exited(lifecycle.killed(rec("b", 1), 1.0, reason="hung"), -9, 2.0),
    )
    after_two = Book(0.0, lost_rounds=frozenset({1, 2}))
    assert policy.rounds_lost(killed, plan_of(3, a, b), after_two) == (after_two, None)


# ----------------------------------------------------------------------------- no hosts


def test_no_hosts_is_said_at_once_and_every_few_seconds():
    cfg = config("-np", "2", "--start-timeout", "30")
    empty = HostsView(usable=(), none_listed=True)
    decisions, book = policy.no_hosts(Book(0.0), empty, cfg, now=1.0)
    said = waiting_of(decisions)
    assert said.what == "a host: the host list lists none" and said.waited == 0.0
    assert decisions[-1] == Wait(1.0 + policy.REPEAT_REPORT_EVERY, only(decisions[1:], Wait).why)
    decisions, book = policy.no_hosts(book, empty, cfg, now=4.0)
    assert kinds(decisions) == [Wait]  # not again so soon
    decisions, book = policy.no_hosts(book, empty, cfg, now=6.0)
    assert waiting_of(decisions).waited == 5.0
    # The start timeout names the empty list, not a count of registrations.
    decisions, _ = policy.plan_round({}, None, book, empty, cfg, now=31.0)
    assert only(decisions, Fail).reason == (
        "discovery has listed no host for 30s: no worker could start within --start-timeout 30s"
    )
    # Hosts came: the memory of the empty list goes.
    decisions, book = policy.no_hosts(book, view("h:2"), cfg, now=7.0)
    assert decisions == () and book.no_hosts_since is None and book.no_hosts_said_at is None


def test_an_empty_list_mid_run_says_the_job_keeps_its_hosts():
    cfg = config("-np", "2", discovery_script="./discover")
    kept = view("h:2", none_listed=True)
    decisions, _ = policy.no_hosts(Book(0.0), kept, cfg, now=1.0)
    assert waiting_of(decisions).what == (
        "a host: the discovery script lists none (the job keeps its 1 host meanwhile)"
    )


def test_a_discovery_error_is_said_when_new_then_at_most_every_30_seconds():
    def said(step) -> ev.HostDiscoveryFailed:
        event = only(step.decisions, Report).event
        assert isinstance(event, ev.HostDiscoveryFailed)
        return event

    step = policy.discovery_failed(Book(0.0), "script exited 1", now=1.0)
    assert str(said(step)) == "host discovery failed: script exited 1"
    for now in (2.0, 3.0, 4.0):  # the same error again, every second
        step = policy.discovery_failed(step.book, "script exited 1", now)
        assert step.decisions == ()
    step = policy.discovery_failed(step.book, "script exited 1", 1.0 + policy.DISCOVERY_ERROR_EVERY)
    assert said(step).again == 3
    assert "(3 more failed runs since it was last said)" in str(said(step))
    step = policy.discovery_failed(step.book, "script timed out", 32.0)  # news: at once
    assert said(step).again == 0
    book = policy.discovery_succeeded(step.book)  # a run that succeeds: the next is news
    assert policy.discovery_failed(book, "script timed out", 33.0).decisions


def waiting_of(decisions) -> ev.Waiting:
    reports = [d for d in decisions if isinstance(d, Report)]
    assert len(reports) == 1 and isinstance(reports[0].event, ev.Waiting), decisions
    return reports[0].event


# ----------------------------------------------------------------------------- the store, progress


def test_an_unreachable_store_is_said_at_once_again_and_when_back():
    health, said = policy.store_health(StoreHealth(), True, "", now=1.0)
    assert health == StoreHealth() and said == []
    health, said = policy.store_health(health, False, "refused", now=2.0)
    assert said == [ev.StoreUnreachable(seconds=0.0, error="refused")]
    health, said = policy.store_health(health, False, "timed out", now=4.0)
    assert said == [] and health.error == "timed out"  # not again so soon
    health, said = policy.store_health(health, False, "timed out", now=2.0 + 5.0)
    assert said == [ev.StoreUnreachable(seconds=5.0, error="timed out")]
    health, said = policy.store_health(health, False, "timed out", now=11.0)
    assert said == []
    health, said = policy.store_health(health, True, "", now=12.5)
    assert said == [ev.StoreBack(seconds=10.5)] and health == StoreHealth()
    assert str(said[0]) == "the rendezvous store is back after 10s"


class Reports:
    """The driver's side of rank 0's progress records, on a fake clock: ``report`` is
    a record heard at ``now``, ``line`` a turn of the progress rule (its event, if it
    says one)."""

    def __init__(self, *args: str):
        self.cfg = config("-np", "2", *args)
        self.book = Book(0.0)

    def report(self, step: int, now: float, round_id: int = 1) -> None:
        self.book = policy.progress_reported(self.book, step, round_id, self.cfg, now)

    def said(self, now: float, plan: Plan | None = None) -> list[ev.Progress]:
        plan = plan or plan_of(1, rec("a", 0), rec("b", 1))
        decisions, self.book = policy.progress_report(self.book, plan, self.cfg, now)
        return [
            d.event for d in decisions if isinstance(d, Report) and isinstance(d.event, ev.Progress)
        ]

    def line(self, now: float, plan: Plan | None = None) -> ev.Progress:
        said = self.said(now, plan)
        assert len(said) == 1, said
        return said[0]


def test_progress_is_said_at_rank_0s_first_report_then_every_interval():
    reports = Reports("--progress-interval", "10")
    assert reports.said(now=1.0) == []  # no step reported yet
    reports.report(3, now=1.0)
    assert reports.line(now=1.0) == ev.Progress(round=1, size=2, step=3, steps_per_second=None)
    decisions, _ = policy.progress_report(reports.book, plan_of(1), reports.cfg, now=5.0)
    assert decisions == (Wait(11.0, "the next progress line"),)
    off = config("-np", "2", "--progress-interval", "0")
    assert policy.progress_report(reports.book, plan_of(1), off, now=100.0) == ((), reports.book)
    assert policy.progress_report(reports.book, None, reports.cfg, now=100.0) == ((), reports.book)


def test_the_line_says_the_newest_step_across_rounds_and_its_rate_over_the_interval():
    """Rank 0 reports every second (``progress_period``), whichever worker it is: each
    line says the step of a second ago at most, never the same step again while training
    runs, and the rate over the last interval of wall time."""
    reports = Reports("--progress-interval", "10")
    lines: list[ev.Progress] = []
    for t in range(1, 32):  # 17 steps/s; a new round (and rank 0) every 4 seconds
        reports.report(17 * t, now=float(t), round_id=1 + t // 4)
        lines += reports.said(now=t + 0.5, plan=plan_of(1 + t // 4, rec("a", 0)))
    said = lines
    assert [(p.round, p.step) for p in said] == [(1, 17), (3, 187), (6, 357), (8, 527)]
    assert [p.steps_per_second for p in said] == [None, 17.0, 17.0, 17.0]
    assert str(said[1]) == "progress: round 3, 1 worker, step 187 (17.0 steps/s)"


def test_a_stall_reads_0_steps_per_second_and_a_quiet_rank_0_is_said():
    reports = Reports("--progress-interval", "10")
    reports.report(10, now=1.0)
    assert reports.line(now=1.0).steps_per_second is None
    for t in range(2, 12):
        reports.report(min(10 * t, 50), now=float(t))  # no new step from t=5 on
    assert reports.line(now=11.0).steps_per_second == 4.0  # 40 steps from t=1 to t=11
    for t in range(12, 22):
        reports.report(50, now=float(t))
    assert reports.line(now=21.0).steps_per_second == 0.0
    # Rank 0 not heard for more than 3 report periods: its step is that old, no rate.
    quiet = reports.line(now=31.0)
    assert quiet.steps_per_second is None and quiet.quiet_for == 10.0
    assert str(quiet) == "progress: round 1, 2 workers, step 50 (rank 0 not heard for 10s)"


def test_a_step_that_went_back_is_said_and_the_rate_never_goes_negative():
    """The state lost (or a resume from an older snapshot): rank 0's step goes back;
    the line says so instead of a negative rate, and the rate starts over from there."""
    reports = Reports("--progress-interval", "10")
    reports.report(20, now=1.0, round_id=4)
    reports.line(now=1.0)
    for t in range(2, 11):
        reports.report(20 * t, now=float(t), round_id=4)
    reports.report(3, now=11.0, round_id=7)  # round 7 trains from the initial state
    back = reports.line(now=11.0)
    assert back.step == 3 and back.back_from == 200 and back.steps_per_second is None
    assert str(back) == "progress: round 1, 2 workers, step 3 (went back from step 200)"
    for t in range(12, 22):
        reports.report(3 + 5 * (t - 11), now=float(t), round_id=7)
    after = reports.line(now=21.0)
    assert after.back_from is None and after.steps_per_second == 5.0
    # A record of an older round heard late (its rank 0 had not yet seen the new one)
    # is no going back.
    reports.report(210, now=21.5, round_id=4)
    assert reports.book.progress_step == 53 and reports.book.progress_back_from is None


def test_the_rate_spans_an_outage_at_its_true_length():
    """No report while the store is away, then two delivered at once: the rate is the
    steps over the whole time between the reports at the window's ends, not a burst
    over the milliseconds between the late ones."""
    reports = Reports("--progress-interval", "10")
    reports.report(10, now=1.0)
    reports.line(now=1.0)
    for t in range(2, 11):
        reports.report(10 * t, now=float(t))
    assert reports.line(now=11.0).steps_per_second == 10.0
    assert reports.line(now=21.0).quiet_for == 11.0
    reports.report(290, now=30.0)
    reports.report(300, now=30.001)
    after = reports.line(now=31.0)
    assert after.quiet_for is None and after.steps_per_second == pytest.approx(10.0, rel=1e-3)


def test_the_job_done_line_says_the_step_training_ended_at():
    p = plan_of(3, rec("a", 0), rec("b", 1))
    done = table(
        rec("a", 0, state=S.FINISHED, exit_code=0), rec("b", 1, state=S.FINISHED, exit_code=0)
    )
    reports = Reports("--progress-interval", "0")  # no lines, and still the last step
    reports.book = dataclasses.replace(reports.book, resets=2)
    reports.report(60, now=4.0, round_id=3)  # (a finish record, heard as the job ends)
    succeed = policy.outcome(done, p, reports.book)
    assert succeed == Succeed(3, 2, 2, step=60)
    assert isinstance(succeed, Succeed)
    event = ev.JobDone(succeed.round, succeed.size, succeed.resets, succeed.step)
    assert str(event) == "job done in round 3 at step 60 (2 workers, 2 resets)"
    assert str(ev.JobDone(3, 2, 2)) == "job done in round 3 (2 workers, 2 resets)"


# ----------------------------------------------------------------------------- the finish


def test_after_the_finish_a_signal_fails_nothing():
    """A worker's training returned (its record): that commit is the job's result. A
    member SIGKILLed after it (the chaos racing the finish, a lost host) fails nothing,
    and the job ends once nobody runs."""
    p = plan_of(2, rec("a", 0), rec("b", 1))
    finished = Book(0.0, training_done_at=5.0, progress_step=90)
    running = table(rec("a", 0, state=S.FINISHED, exit_code=0, since=6.0), rec("b", 1))
    assert policy.outcome(running, p, finished) is None
    killed = table(
        rec("a", 0, state=S.FINISHED, exit_code=0, since=6.0),
        rec("b", 1, state=S.FAILED, exit_code=-9, since=6.5),
    )
    assert policy.outcome(killed, p, finished) == Succeed(round=2, size=2, resets=0, step=90)


def test_after_the_finish_an_error_of_the_script_fails_the_job():
    p = plan_of(2, rec("a", 0), rec("b", 1))
    finished = Book(0.0, training_done_at=5.0)
    one = table(
        rec("a", 0, state=S.FINISHED, exit_code=0, since=6.0),
        rec("b", 1, state=S.FAILED, exit_code=1, since=6.0),
    )
    reason = only([policy.outcome(one, p, finished)], Fail).reason
    assert reason.startswith("worker rank 1 (b) ended (exit 1) after the training finished")
    every = table(
        rec("a", 0, state=S.FAILED, exit_code=1, since=6.0),
        rec("b", 1, state=S.FAILED, exit_code=1, since=6.0),
    )
    reason = only([policy.outcome(every, p, finished)], Fail).reason
    assert reason.startswith("the training script fails: every worker of round 2")
    # An error before the finish was replaced as usual: not the script's end.
    early = table(
        rec("a", 0, state=S.FINISHED, exit_code=0, since=6.0),
        rec("b", 1, state=S.FINISHED, exit_code=0, since=6.0),
        rec("z", 2, state=S.FAILED, exit_code=1, since=1.0),
    )
    assert isinstance(policy.outcome(early, p, finished), Succeed)


def test_after_the_finish_with_nobody_exiting_0_the_job_fails():
    p = plan_of(2, rec("a", 0), rec("b", 1))
    t = table(
        rec("a", 0, state=S.FAILED, exit_code=-9, since=6.0),
        rec("b", 1, state=S.FAILED, exit_code=-9, since=6.0),
    )
    reason = only([policy.outcome(t, p, Book(0.0, training_done_at=5.0))], Fail).reason
    assert "every worker was killed before it exited" in reason


def test_after_the_finish_no_report_accuses_and_no_worker_is_relaunched():
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(2, a, b)
    finished = Book(0.0, training_done_at=5.0)
    report = FailureRecord("a", 2, "connection closed", suspect="b")
    _, book = policy.failure_reported(table(a, b), p, finished, report, now=6.0)
    assert book.accused == ()
    cfg = config("-np", "2")
    assert policy.slots_to_fill(table(a), hs("h:2"), finished, cfg) == []


def test_a_round_whose_workers_all_fail_on_their_own_says_the_script_fails():
    """Every member of round 1 exits 1 after committing: the next round has none of
    them, and the reason is the script failing, not the state lost."""
    cfg = config("-np", "2", checkpoint_dir="/ckpt")
    p = plan_of(1, rec("a", 0), rec("b", 1))
    t = table(
        rec("a", 0, state=S.FAILED, exit_code=1),
        rec("b", 1, state=S.FAILED, exit_code=1),
        rec("c", 0, seq=10),
        rec("d", 1, seq=11),
    )
    step = policy.plan_round(t, p, Book(0.0, progress_step=40), view("h:2"), cfg, now=1.0)
    reason = only(step.decisions, Fail).reason
    assert "the training script fails" in reason and "state was lost" not in reason


# ----------------------------------------------------------------------------- a world replaced


def test_a_world_replaced_whole_keeps_its_holders_until_the_newcomers_commit():
    """Every member's host left (discovery swapped the hosts): the members leave at a
    commit, but stay planned until rank 0 has committed in a round with the newcomers."""
    old = [rec("a", 0, host="old"), rec("b", 1, host="old")]
    p1 = plan_of(1, *old)
    cfg = config("--min-np", "2", "-H", "new:2")
    new = [rec("c", 0, host="new", seq=10), rec("d", 1, host="new", seq=11)]
    usable = view("new:2")
    stop = policy.workers_to_stop(table(*old), usable.usable, p1, now=0.0)
    assert kinds(stop) == [Report, Leave, Report, Leave]
    assert [d.until for d in stop if isinstance(d, Leave)] == [60.0, 60.0]
    holders = frozenset({"a", "b"})
    leaving = Book(0.0, leaving=(("a", 60.0), ("b", 60.0)), commit_members=holders, progress_step=9)
    gone = [
        dataclasses.replace(r, state=S.STOPPING) for r in old
    ]  # (Leave: counted as stopping, still running and registered)
    t = table(*gone, *new)
    step = policy.plan_round(t, p1, leaving, usable, cfg, now=1.0)
    grown = only([d for d in step.decisions if isinstance(d, Publish)], Publish).plan
    assert grown.worker_ids == ("a", "b", "c", "d") and grown.handover
    # Round 2 formed; until rank 0 commits in it, the holders stay.
    step = policy.plan_round(t, grown, leaving, usable, cfg, now=2.0)
    assert not [d for d in step.decisions if isinstance(d, Publish)]
    assert any(isinstance(d, Wait) for d in step.decisions)
    # Once it has, the round without them follows, as a handover.
    committed = policy.progress_reported(leaving, 12, 2, cfg, 3.0, commit_round=2, plan=grown)
    step = policy.plan_round(t, grown, committed, usable, cfg, now=3.0)
    last = only([d for d in step.decisions if isinstance(d, Publish)], Publish).plan
    assert last.worker_ids == ("c", "d") and last.handover


def test_holders_with_no_newcomer_get_a_snapshot_before_they_go():
    old = [rec("a", 0, host="old", state=S.STOPPING), rec("b", 1, host="old", state=S.STOPPING)]
    p1 = plan_of(1, *old)
    leaving = Book(0.0, leaving=(("a", 60.0), ("b", 60.0)))
    step = policy.leaving_due(table(*old), leaving, 61.0, p1, snapshots=True)
    assert kinds(step.decisions) == [SnapshotNow]
    assert step.book.leaving == () and [h for h, _, _ in step.book.draining] == ["old"]
    # Without a checkpoint folder they are stopped: the loss is then said loudly.
    step = policy.leaving_due(table(*old), leaving, 61.0, p1, snapshots=False)
    assert kinds(step.decisions) == [Stop, Stop]
