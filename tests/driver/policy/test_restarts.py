"""Restart mode's rules (``driver.policy.restarts``) and the layout of a world
(``driver.policy.planner``): pure functions of records, plan, book, hosts, config and
time, checked decision by decision."""

from __future__ import annotations

from dataclasses import replace

import pytest

from driver import events as ev
from driver.config import parse_args
from driver.hosts.slots import HostSlots, parse_host_slots
from driver.policy import planner, restarts
from driver.policy.decisions import (
    Book,
    Decision,
    Fail,
    HostLost,
    HostsView,
    PrepareHost,
    Report,
    StartWorld,
    Stop,
    Succeed,
    Wait,
)
from driver.policy.lifecycle import WorkerRecord, WorkerState
from driver.policy.memory.rounds import RoundBook
from driver.policy.memory.worlds import WorldBook, WorldEnd
from driver.policy.rounds import RoundSettings
from rendezvous.schema.rounds import Plan

pytestmark = pytest.mark.unit  # pure logic: no process, no socket

S = WorkerState
T0 = 100.0


def hosts(spec: str) -> HostsView:
    usable = tuple(parse_host_slots(e, 1) for e in spec.split(",")) if spec else ()
    return HostsView(usable=usable, available_slots=sum(h.slots for h in usable))


def config(*args: str) -> RoundSettings:
    """The world rules' slice of the configuration the flags ``args`` give."""
    return RoundSettings.from_config(parse_args(["--restart-workers", *args, "python", "train.py"]))


def world_of(spec: str, number: int = 1, restarts_: int = 0) -> planner.World:
    return planner.lay_out_world(number, restarts_, planner.world_slots(hosts(spec).usable, None))


def running(world: planner.World, at: float = T0) -> tuple[Plan, dict[str, WorkerRecord]]:
    """The plan of ``world`` with one launched worker per seat (ids ``w0``, ``w1``...)."""
    ids = [f"w{seat.rank}" for seat in world.seats]
    records = {
        f"w{s.rank}": WorkerRecord.launched(f"w{s.rank}", s.host, s.slot, at) for s in world.seats
    }
    return planner.world_plan(world, ids), records


def exited(rec: WorkerRecord, code: int, kill_reason: str | None = None) -> WorkerRecord:
    state = S.FINISHED if code == 0 else S.FAILED
    return replace(rec, state=state, exit_code=code, kill_reason=kill_reason)


def kinds(decisions) -> list[str]:
    return [type(d).__name__ for d in decisions]


def start_of(decision: Decision) -> StartWorld:
    assert isinstance(decision, StartWorld), decision
    return decision


def said(decision: Decision) -> ev.Event:
    assert isinstance(decision, Report), decision
    return decision.event


def world_stopping(decision: Decision) -> ev.WorldStopping:
    event = said(decision)
    assert isinstance(event, ev.WorldStopping), event
    return event


def stops(decisions) -> list[str]:
    """The workers ``decisions`` stop (every one of them a ``Stop``)."""
    assert all(isinstance(d, Stop) for d in decisions), decisions
    return [d.worker_id for d in decisions]


def failure(decision: Decision) -> str:
    assert isinstance(decision, Fail), decision
    return decision.reason


# ----------------------------------------------------------------------------- layout


def test_a_world_takes_every_slot_in_placement_order_with_torchruns_ranks():
    world = world_of("a:2,b:3")
    assert world.size == 5 and world.hosts == ("a", "b")
    assert [(s.host, s.slot, s.rank) for s in world.seats] == [
        ("a", 0, 0),
        ("a", 1, 1),
        ("b", 0, 2),
        ("b", 1, 3),
        ("b", 2, 4),
    ]
    assert [(s.local_rank, s.local_size, s.group_rank) for s in world.seats] == [
        (0, 2, 0),
        (1, 2, 0),
        (0, 3, 1),
        (1, 3, 1),
        (2, 3, 1),
    ]


def test_max_np_cuts_a_world_and_its_plan_is_round_number_with_the_same_ranks():
    slots = planner.world_slots((HostSlots("a", 2), HostSlots("b", 2)), 3)
    world = planner.lay_out_world(4, 1, slots)
    assert world.size == 3 and world.hosts == ("a", "b")
    plan = planner.world_plan(world, ["x", "y", "z"])
    assert plan.round_id == 4 and plan.worker_ids == ("x", "y", "z")
    assert [(m.host, m.slot, m.rank, m.local_rank) for m in plan.members] == [
        ("a", 0, 0, 0),
        ("a", 1, 1, 1),
        ("b", 0, 2, 0),
    ]
    assert planner.world_plan(world, ["x"]).worker_ids == ("x",)  # a start that failed
    with pytest.raises(ValueError):
        planner.world_plan(world, ["a", "b", "c", "d"])


# ----------------------------------------------------------------------------- first world


def test_the_first_world_starts_once_the_hosts_hold_np_slots():
    cfg = config("-np", "3", "--host-discovery-script", "/bin/true")
    book = Book.start(T0)
    waiting = restarts.world_rule({}, None, book, hosts("a:2"), cfg, T0 + 1)
    assert waiting.decisions == (Wait(T0 + cfg.start_timeout, "-np slots"),)
    (decision,) = restarts.world_rule({}, None, book, hosts("a:2,b:2"), cfg, T0 + 1).decisions
    start = start_of(decision)
    assert start.seconds == 0.0
    assert start.world.number == 1 and start.world.restarts == 0 and start.world.size == 4


def test_the_first_world_fails_the_job_after_the_start_timeout():
    cfg = config("-np", "3", "--host-discovery-script", "/bin/true", "--start-timeout", "5")
    (fail,) = restarts.world_rule({}, None, Book.start(T0), hosts("a:2"), cfg, T0 + 6).decisions
    assert "only 2 usable slot(s) for -np 3" in failure(fail) and "--start-timeout 5s" in failure(
        fail
    )


def test_max_np_caps_the_first_world():
    cfg = config("-np", "2", "--max-np", "3", "-H", "a:2,b:2")
    (start,) = restarts.world_rule({}, None, Book.start(T0), hosts("a:2,b:2"), cfg, T0).decisions
    assert start_of(start).world.size == 3


# ----------------------------------------------------------------------------- a world ends


def test_a_worker_that_fails_stops_every_other_and_the_next_world_is_a_restart():
    cfg = config("-np", "3")
    plan, records = running(world_of("localhost:3"))
    records["w1"] = exited(records["w1"], 1)
    book = Book(RoundBook(T0, change_at=T0 + 100))
    step = restarts.world_rule(records, plan, book, hosts("localhost:3"), cfg, T0 + 100)
    report, *rest = step.decisions
    event = world_stopping(report)
    assert event.failure and "worker [1] localhost:1 exit 1" in event.reason
    assert stops(rest) == ["w0", "w2"]
    assert step.book.world.end == WorldEnd(event.reason, failure=True)
    # Once stopping, nothing more is said or sent until they are gone.
    records["w0"] = replace(records["w0"], state=S.STOPPING)
    records["w2"] = replace(records["w2"], state=S.STOPPING)
    again = restarts.world_rule(records, plan, step.book, hosts("localhost:3"), cfg, T0 + 101)
    assert again.decisions == ()
    records["w0"] = replace(records["w0"], state=S.STOPPED, exit_code=-15)
    records["w2"] = replace(records["w2"], state=S.STOPPED, exit_code=-15)
    (decision,) = restarts.world_rule(
        records, plan, again.book, hosts("localhost:3"), cfg, T0 + 102
    ).decisions
    start = start_of(decision)
    assert start.world.number == 2 and start.world.restarts == 1 and start.seconds == 2.0


def test_a_killed_worker_ends_its_world_at_once_before_its_exit():
    """A host lost (an agent's lease, a probe): the driver's kill is the failure; the
    world's other workers are stopped without waiting for the kill's exit."""
    cfg = config("-np", "2", "-H", "a:1,b:1")
    plan, records = running(world_of("a:1,b:1"))
    records["w1"] = replace(records["w1"], state=S.KILLED, kill_reason="its host b is unreachable")
    step = restarts.world_rule(records, plan, Book.start(T0), hosts("a:1"), cfg, T0 + 200)
    report, stop = step.decisions
    event = world_stopping(report)
    assert event.failure and "killed by the driver: its host b" in event.reason
    assert stop == Stop("w0", f"world 1 stops: {event.reason}")


def test_a_host_that_discovery_removes_restarts_the_world_without_counting_it():
    cfg = config("--min-np", "1", "--host-discovery-script", "/bin/true")
    plan, records = running(world_of("a:1,b:1"))
    step = restarts.world_rule(records, plan, Book.start(T0), hosts("a:1"), cfg, T0 + 200)
    report, *rest = step.decisions
    event = world_stopping(report)
    assert not event.failure and "the slot of worker [1] b:0 left the job" in event.reason
    assert stops(rest) == ["w0", "w1"]
    for w in records:
        records[w] = replace(records[w], state=S.STOPPED, exit_code=-15)
    (decision,) = restarts.world_rule(
        records, plan, step.book, hosts("a:1"), cfg, T0 + 201
    ).decisions
    start = start_of(decision)
    assert start.world.restarts == 0 and start.world.size == 1 and start.world.number == 2


def test_more_slots_restart_the_world_bigger_until_a_worker_has_finished():
    cfg = config("--min-np", "1", "--host-discovery-script", "/bin/true")
    plan, records = running(world_of("a:1"))
    book = Book.start(T0)
    (report, stop) = restarts.world_rule(records, plan, book, hosts("a:1,b:2"), cfg, T0).decisions
    event = world_stopping(report)
    assert "3 slots are usable: the world grows from 1" in event.reason
    assert not event.failure and stops([stop]) == ["w0"]
    plan, records = running(world_of("a:2"))
    records["w1"] = exited(records["w1"], 0)  # the training ends: no restart for a newcomer
    quiet = restarts.world_rule(records, plan, book, hosts("a:2,b:2"), cfg, T0)
    assert quiet.decisions == () and quiet.book.world.end is None


def test_the_world_grows_only_onto_a_host_whose_agent_is_live_and_starts_it_meanwhile():
    """A host listed again but not ready (its agent not live: a node still cut off once
    its cooldown ended) must not stop a healthy world: its agent is started beside
    the world, and the world grows once it is ready."""
    cfg = config("--min-np", "1", "--host-discovery-script", "/bin/true")
    plan, records = running(world_of("a:1"))
    book, view = Book.start(T0), hosts("a:1,b:2")
    waiting = restarts.world_rule(records, plan, book, view, cfg, T0, frozenset({"a"}))
    assert waiting.decisions == (PrepareHost("b"),) and waiting.book.world.end is None
    grows = restarts.world_rule(records, plan, book, view, cfg, T0, frozenset({"a", "b"}))
    assert kinds(grows.decisions) == ["Report", "Stop"]
    assert "3 slots are usable" in world_stopping(grows.decisions[0]).reason


def test_a_preempted_host_leaves_the_job_and_its_workers_stop_now():
    _, records = running(world_of("a:1,b:2"))
    report, lost, *rest = restarts.world_host_preempted(records, "b")
    event = said(report)
    assert isinstance(event, ev.HostPreempted) and event.workers == ["w1", "w2"]
    assert lost == HostLost("b", "preempted")
    assert stops(rest) == ["w1", "w2"]


def test_workers_of_no_world_are_stopped_and_waited_for_before_a_world_starts():
    """A driver taking the job over finds workers its predecessor started."""
    cfg = config("-np", "1")
    stray = WorkerRecord.launched("old", "localhost", 0, T0)
    step = restarts.world_rule({"old": stray}, None, Book.start(T0), hosts("localhost:1"), cfg, T0)
    assert step.decisions == (Stop("old", "it is in no world of this driver's"),)
    stopping = {"old": replace(stray, state=S.STOPPING)}
    assert (
        restarts.world_rule(stopping, None, step.book, hosts("localhost:1"), cfg, T0).decisions
        == ()
    )


def test_registered_spares_take_their_hosts_seats_and_are_no_strays():
    """Warm spares (``--spares``) wait across worlds: the next world starts without
    waiting for them, a registered one takes a seat of its own host (longest
    registered first), a spare still starting does not."""
    cfg = config("-np", "3", "--spares", "2")
    spare = WorkerRecord.launched("s", "a", 0, T0, spare=True)
    spares = {
        "a-old": replace(spare, worker_id="a-old", state=S.REGISTERED, registered_seq=1),
        "a-new": replace(spare, worker_id="a-new", slot=1, state=S.REGISTERED, registered_seq=5),
        "b-cold": replace(spare, worker_id="b-cold", host="b"),  # not registered yet
    }
    step = restarts.world_rule(spares, None, Book.start(T0), hosts("a:2,b:1"), cfg, T0)
    (start,) = step.decisions  # no Stop: a spare is in no world, yet no stray
    world = start_of(start).world
    assert restarts.world_spares(world, spares) == {0: "a-old", 1: "a-new"}


# ----------------------------------------------------------------------------- limits


def test_the_reset_limit_bounds_the_restarts_after_failures():
    cfg = config("-np", "2", "--reset-limit", "1")
    plan, records = running(world_of("localhost:2", number=3, restarts_=1))
    for w, code in (("w0", 1), ("w1", -15)):
        records[w] = exited(records[w], code)
    book = Book(RoundBook(T0, resets=1))
    step = restarts.world_rule(records, plan, book, hosts("localhost:2"), cfg, T0 + 500)
    *_, fail = step.decisions
    assert failure(fail).startswith("restart limit exceeded: world 3 failed (worker [0]")
    assert "after 1 restart(s) (--reset-limit 1)" in failure(fail)


def test_a_script_that_dies_as_it_starts_ends_the_job_after_three_worlds():
    cfg = config("-np", "1")
    book = Book.start(T0)
    now = T0
    for number in range(1, restarts.QUICK_FAILURES + 1):
        plan, records = running(world_of("localhost:1", number), at=now)
        records["w0"] = exited(records["w0"], 1)
        step = restarts.world_rule(records, plan, book, hosts("localhost:1"), cfg, now + 5)
        book, now = step.book, now + 10
        if number < restarts.QUICK_FAILURES:
            assert isinstance(step.decisions[-1], StartWorld)
    assert "an error within 60s of its start in 3 worlds in a row" in failure(step.decisions[-1])


def test_killed_workers_say_nothing_of_the_script_however_soon():
    """An operator's SIGKILL (or the OOM killer), and its peer's error that follows it,
    in world after world: restarts, never the end of the job."""
    cfg = config("-np", "2")
    book, now = Book.start(T0), T0
    for number in range(1, restarts.QUICK_FAILURES + 2):
        plan, records = running(world_of("localhost:2", number), at=now)
        records["w0"] = exited(records["w0"], 1)  # gloo: connection reset by its peer
        records["w1"] = exited(records["w1"], -9)
        step = restarts.world_rule(records, plan, book, hosts("localhost:2"), cfg, now + 5)
        book, now = step.book, now + 10
        assert (
            start_of(step.decisions[-1]).world.restarts == number and book.world.quick_failures == 0
        )


def test_a_world_that_lived_long_resets_the_count_of_quick_deaths():
    cfg = config("-np", "1")
    plan, records = running(world_of("localhost:1"))
    records["w0"] = exited(records["w0"], 1)
    book = Book(RoundBook(T0), world=WorldBook(quick_failures=2))
    later = T0 + restarts.QUICK_FAILURE + 1
    step = restarts.world_rule(records, plan, book, hosts("localhost:1"), cfg, later)
    assert step.book.world.quick_failures == 0 and isinstance(step.decisions[-1], StartWorld)


def test_below_min_np_the_job_waits_says_so_and_gives_up_after_the_elastic_timeout():
    cfg = config("-np", "2", "-H", "a:1,b:1", "--elastic-timeout", "30")
    plan, records = running(world_of("a:1,b:1"))
    records["w0"] = exited(records["w0"], -15)
    records["w1"] = exited(records["w1"], -9, kill_reason="its host b is unreachable")
    book = Book(RoundBook(T0), world=WorldBook(end=WorldEnd("lost", True)))
    first = restarts.world_rule(records, plan, book, hosts("a:1"), cfg, T0)
    assert kinds(first.decisions) == ["Wait", "Wait"] and first.book.rounds.broken_since == T0
    later = restarts.world_rule(records, plan, first.book, hosts("a:1"), cfg, T0 + 2)
    waiting = said(later.decisions[0])
    assert isinstance(waiting, ev.Waiting)
    assert "waiting for 2 slots to start the next (have 1)" in waiting.what
    (fail,) = restarts.world_rule(records, plan, later.book, hosts("a:1"), cfg, T0 + 31).decisions
    assert failure(fail).startswith("no world of at least 2 workers could form within")


# ----------------------------------------------------------------------------- the end


def test_the_job_succeeds_once_every_worker_of_the_world_exited_0():
    plan, records = running(world_of("localhost:2", number=2, restarts_=1))
    book = Book(RoundBook(T0, resets=1))
    records["w0"] = exited(records["w0"], 0)
    assert restarts.world_outcome(records, plan, book) is None  # the other one finishes
    records["w1"] = exited(records["w1"], 0)
    assert restarts.world_outcome(records, plan, book) == Succeed(2, 2, 1)
    ending = replace(book, world=WorldBook(WorldEnd("a host left", False)))
    assert restarts.world_outcome(records, plan, ending) is None
    assert restarts.world_outcome({}, None, book) is None


def test_a_world_that_could_not_start_ends_as_a_failure():
    book = restarts.world_launch_failed(Book.start(T0), "no ssh")
    assert book.world.end == WorldEnd("a worker could not start: no ssh", failure=True)
    assert restarts.world_launch_failed(book, "again") is book


def test_the_rules_are_on_the_policy_face():
    assert restarts.world_rule is restarts.world_rule
    assert restarts.world_outcome is restarts.world_outcome
