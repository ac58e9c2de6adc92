"""Which workers occupy which slots (``driver.policy.occupancy``): free slots,
displaced and hung workers, the chaos, removed hosts' agents, every host blacklisted."""

from __future__ import annotations

import dataclasses

import pytest

from driver import events as ev
from driver.policy import occupancy
from driver.policy.decisions import (
    Book,
    Fail,
    HostsView,
    Kill,
    Launch,
    Report,
    RetireAgent,
    Stop,
    Wait,
)
from driver.policy.memory.rounds import RoundBook
from driver.policy.planner import WorkerSlot
from tests.driver.policy.builders import S, hs, kinds, only, plan_of, rec, settings, table, view

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


# ----------------------------------------------------------------------------- workers


def test_reregister_grace_then_kill():
    lapsed = rec("a", 0, state=S.UNREGISTERED, since=5.0)
    t = table(lapsed, rec("b", 1))
    assert occupancy.workers_to_kill(t, now=5.0 + occupancy.REREGISTER_GRACE) == []
    assert occupancy.lapse_waits(t) == [
        Wait(5.0 + occupancy.REREGISTER_GRACE, "a to register again")
    ]
    assert occupancy.workers_to_kill(t, now=15.5) == [
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
    assert occupancy.workers_to_stop(t, hs("h:1")) == [
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
    retire = occupancy.agents_to_retire(agents, ("shard",), t, hosts)
    assert retire == [RetireAgent("gone")]
    # Once the stopping worker's exit is reported, its host's agent goes too.
    t["s"] = rec("s", 0, host="busy", state=S.STOPPED)
    assert occupancy.agents_to_retire(agents, (), t, hosts) == [
        RetireAgent("busy"),
        RetireAgent("gone"),
        RetireAgent("shard"),
    ]
    # A host discovery lists again keeps its agent.
    again = view("h:1,gone:1,busy:1,shard:1", blacklisted=("cool",), listed=("cool2",))
    assert occupancy.agents_to_retire(agents, (), t, again) == []


def test_free_slots_are_filled_but_not_finished_ones():
    cfg = settings("-np", "3")
    # A worker being stopped still holds its slot; an exited one does not.
    t = table(
        rec("a", 0, host="localhost"),
        rec("b", 1, host="localhost", state=S.STOPPING),
        rec("c", 2, host="localhost", state=S.FAILED, exit_code=1),
    )
    assert occupancy.slots_to_fill(t, hs("localhost:3"), Book.start(0.0), cfg.max_np) == [
        Launch("localhost", 2)
    ]
    t = table(
        rec("a", 0, host="localhost"), rec("c", 2, host="localhost", state=S.FAILED, exit_code=1)
    )
    assert occupancy.slots_to_fill(t, hs("localhost:3"), Book.start(0.0), cfg.max_np) == [
        Launch("localhost", 1),
        Launch("localhost", 2),
    ]
    done = Book(RoundBook(0.0, done_slots=frozenset({WorkerSlot("localhost", 1)})))
    assert occupancy.slots_to_fill(t, hs("localhost:3"), done, cfg.max_np) == [
        Launch("localhost", 2)
    ]
    capped = dataclasses.replace(cfg, max_np=1)
    assert occupancy.slots_to_fill(t, hs("localhost:3"), Book.start(0.0), capped.max_np) == []


def test_chaos_never_takes_the_round_below_min_np():
    """The world the chaos tests is one the user declared survivable: never below
    --min-np, in a round already shrunk too, and in a job of fixed size never more than
    one worker short."""
    a, b, c, d = rec("a", 0), rec("b", 1), rec("c", 2), rec("d", 3)
    p = plan_of(1, a, b, c, d)
    full, one_down = table(a, b, c, d), table(a, b, c, rec("d", 3, state=S.CHAOS_KILLED))
    two_down = table(a, b, rec("c", 2, state=S.FAILED), rec("d", 3, state=S.CHAOS_KILLED))
    # -np 4 --min-np 2: down to 2, never to 1.
    assert occupancy.chaos_candidates(one_down, p, Book.start(0.0), min_np=2, np=4) == [
        "a",
        "b",
        "c",
    ]
    assert occupancy.chaos_candidates(two_down, p, Book.start(0.0), min_np=2, np=4) == []
    # -np 3 --min-np 2, a round already down to 2: its size is no floor.
    shrunk = plan_of(2, a, b)
    assert occupancy.chaos_candidates(table(a, b), shrunk, Book.start(0.0), min_np=2, np=3) == []
    assert occupancy.chaos_candidates(
        table(a, b, c), plan_of(3, a, b, c), Book.start(0.0), 2, 3
    ) == [
        "a",
        "b",
        "c",
    ]
    # -np 4 (min 4): one short at a time, while the round is whole.
    assert occupancy.chaos_candidates(full, p, Book.start(0.0), min_np=4, np=4) == [
        "a",
        "b",
        "c",
        "d",
    ]
    assert occupancy.chaos_candidates(one_down, p, Book.start(0.0), min_np=4, np=4) == []
    # -np 1: its only worker holds the state: never, unless asked.
    solo = plan_of(1, a)
    assert occupancy.chaos_candidates(table(a), solo, Book.start(0.0), min_np=1, np=1) == []
    assert occupancy.chaos_candidates(table(a), solo, Book.start(0.0), 1, 1, below_min_np=True) == [
        "a"
    ]
    assert occupancy.chaos_candidates(two_down, p, Book.start(0.0), 2, 4, below_min_np=True) == [
        "a",
        "b",
    ]
    assert [occupancy.chaos_floor(m, n) for m, n in [(2, 3), (2, 2), (1, 1), (3, 8)]] == [
        2,
        1,
        1,
        3,
    ]


def test_chaos_picks_active_members_and_spares_the_end():
    a, b, c = rec("a", 0), rec("b", 1), rec("c", 2)
    p = plan_of(1, a, b, c)
    t = table(a, rec("b", 1, state=S.CHAOS_KILLED), c)
    assert occupancy.chaos_candidates(t, p, Book.start(0.0), min_np=1, np=3) == ["a", "c"]
    done = Book(RoundBook(0.0, done_slots=frozenset({WorkerSlot("h", 2)})))
    assert occupancy.chaos_candidates(t, p, done, min_np=1, np=3) == []
    # A worker's training returned (its finish record), though none has exited yet.
    returned = Book(RoundBook(0.0, training_done_at=5.0))
    assert occupancy.chaos_candidates(t, p, returned, min_np=1, np=3) == []
    assert occupancy.chaos_candidates(t, None, Book.start(0.0), min_np=1, np=3) == []
    assert occupancy.chaos_kill(c, p, pid=77, kills=2) == [
        Report(ev.ChaosKill(worker="c", host="h", slot=2, rank=2, pid=77, kill=2)),
        Kill("c", "chaos", chaos=True),
    ]


# ----------------------------------------------------------------------------- hosts


def test_all_hosts_blacklisted_waits_for_a_cooldown_within_the_limit():
    cfg = settings("-np", "1", "--start-timeout", "20", "--elastic-timeout", "30")
    gone = table(rec("a", 0, state=S.FAILED, exit_code=1))
    out = HostsView(usable=(), blacklisted=("h",), all_blacklisted=True, next_release=15.0)
    assert occupancy.hosts_rule(gone, None, Book.start(0.0), out, cfg, now=5.0) == [
        Wait(15.0, "a blacklisted host to come back")
    ]
    late = dataclasses.replace(out, next_release=25.0)
    assert occupancy.hosts_rule(gone, None, Book.start(0.0), late, cfg, now=5.0) == [
        Fail(
            "every host is blacklisted after repeated worker failures (h) and none comes "
            "back within --start-timeout"
        )
    ]
    p = plan_of(1, rec("a", 0))
    assert occupancy.hosts_rule(
        gone, p, Book(RoundBook(0.0, broken_since=0.0)), late, cfg, now=5.0
    ) == [Wait(25.0, "a blacklisted host to come back")]
    later = dataclasses.replace(out, next_release=31.0)
    decisions = occupancy.hosts_rule(
        gone, p, Book(RoundBook(0.0, broken_since=0.0)), later, cfg, now=5.0
    )
    assert "--elastic-timeout" in only(decisions, Fail).reason
    never = dataclasses.replace(out, next_release=None)
    assert kinds(occupancy.hosts_rule(gone, p, Book.start(0.0), never, cfg, now=5.0)) == [Fail]
    # A worker still running (its host's cooldown is not its end): no verdict yet.
    assert occupancy.hosts_rule(table(rec("b", 0)), p, Book.start(0.0), never, cfg, now=5.0) == []
