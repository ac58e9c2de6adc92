"""Round planning: membership, rank order, local/cross ranks, and slots to fill."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.hosts.slots import HostSlots, parse_host_slots
from driver.policy.planner import (
    WorkerSlot,
    allowed_slots,
    build_plan,
    displaced_workers,
    free_slots,
    needs_new_round,
    next_plan,
    round_is_intact,
)
from rendezvous.schema.rounds import Member, Plan
from rendezvous.schema.workers import WorkerInfo

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


def hs(spec: str) -> tuple[HostSlots, ...]:
    return tuple(parse_host_slots(e, 1) for e in spec.split(",")) if spec else ()


def worker(worker_id: str, host: str, slot: int) -> WorkerInfo:
    return WorkerInfo(
        worker_id=worker_id, host=host, slot=slot, pid=1000 + slot, address=f"{host}:{7000 + slot}"
    )


def ws(spec: str) -> list[WorkerInfo]:
    """'w1@a/0,w2@b/1' -> workers in that (registration) order."""
    out = []
    for item in spec.split(","):
        worker_id, place = item.split("@")
        host, slot = place.split("/")
        out.append(worker(worker_id, host, int(slot)))
    return out


def ids(plan: Plan | None) -> list[str] | None:
    return None if plan is None else list(plan.worker_ids)


def ranks(plan: Plan) -> list[tuple[str, int, int, int, int, int]]:
    """(id, rank, local_rank, local_size, cross_rank, cross_size) per member."""
    return [
        (m.worker_id, m.rank, m.local_rank, m.local_size, m.cross_rank, m.cross_size)
        for m in plan.members
    ]


# ----------------------------------------------------------------------------- slots


def test_allowed_slots_in_host_then_slot_order():
    assert allowed_slots(hs("b:2,a:1")) == (
        WorkerSlot("b", 0),
        WorkerSlot("b", 1),
        WorkerSlot("a", 0),
    )
    assert allowed_slots(()) == ()


def test_displaced_workers():
    live = ws("w1@a/0,w2@a/1,w3@b/0,w4@c/0")
    assert displaced_workers(live, hs("a:1,b:1")) == (live[1], live[3])
    assert displaced_workers(live, hs("a:2,b:1,c:1")) == ()


@pytest.mark.parametrize(
    "hosts, occupied, max_np, expected",
    [
        ("a:2", [], None, [("a", 0), ("a", 1)]),
        ("a:2,b:2", [("a", 1)], None, [("a", 0), ("b", 0), ("b", 1)]),
        ("a:2,b:2", [], 3, [("a", 0), ("a", 1), ("b", 0)]),
        ("a:2,b:2", [("b", 1)], 3, [("a", 0), ("a", 1)]),
        ("a:2,b:2", [("a", 0), ("a", 1), ("b", 0)], 3, []),
        (
            "a:2,b:2",
            [("a", 0), ("a", 1), ("b", 0), ("b", 1)],
            3,
            [],
        ),  # over the cap: nothing, no error
        ("a:2", [("gone", 0), ("gone", 1)], 2, [("a", 0), ("a", 1)]),  # displaced ones don't count
        ("a:1", [("a", 5)], 1, [("a", 0)]),  # slot past the count
        ("a:2", [("a", 0), ("a", 0)], None, [("a", 1)]),  # two claims, one slot
        ("", [], None, []),
        ("b:1,a:1", [], None, [("b", 0), ("a", 0)]),  # host order, not names
    ],
)
def test_free_slots(hosts, occupied, max_np, expected):
    result = free_slots(hs(hosts), occupied, max_np)
    assert result == tuple(WorkerSlot(*s) for s in expected)


def test_free_slots_accepts_worker_slots():
    assert free_slots(hs("a:2"), [WorkerSlot("a", 0)], None) == (WorkerSlot("a", 1),)


# ----------------------------------------------------------------------------- build_plan


@pytest.mark.parametrize(
    "placement, expected",
    [
        # placement: hosts of ranks 0..n-1; expected: (local_rank, local_size, cross_rank, cross_size)
        ("a", [(0, 1, 0, 1)]),
        ("a,a", [(0, 2, 0, 1), (1, 2, 0, 1)]),
        ("a,b", [(0, 1, 0, 2), (0, 1, 1, 2)]),
        ("a,a,b,b", [(0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]),
        ("a,b,a,b", [(0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)]),
        # uneven hosts: local_rank 1 exists only on a and c
        ("a,a,b,c,c", [(0, 2, 0, 3), (1, 2, 0, 2), (0, 1, 1, 3), (0, 2, 2, 3), (1, 2, 1, 2)]),
        # cross rank follows the rank of the worker with that local rank, not of its host's first
        ("a,b,b,a", [(0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)]),
        ("b,a,a,b", [(0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)]),
    ],
)
def test_local_and_cross_ranks(placement, expected):
    slots_used: Counter = Counter()
    workers = []
    for i, host in enumerate(placement.split(",")):
        workers.append(worker(f"w{i}", host, slots_used[host]))
        slots_used[host] += 1
    plan = build_plan(7, workers)
    assert plan.round_id == 7
    assert [m.rank for m in plan.members] == list(range(len(workers)))
    assert [
        (m.local_rank, m.local_size, m.cross_rank, m.cross_size) for m in plan.members
    ] == expected


def test_build_plan_copies_worker_fields():
    w = worker("w9", "h", 3)
    (member,) = build_plan(1, [w]).members
    assert member == Member(
        worker_id="w9",
        host="h",
        slot=3,
        address="h:7003",
        rank=0,
        local_rank=0,
        local_size=1,
        cross_rank=0,
        cross_size=1,
    )


# ----------------------------------------------------------------------------- next_plan


def test_first_round():
    plan = next_plan(None, ws("w2@b/0,w1@a/1,w0@a/0"), hs("a:2,b:1"), min_np=3, max_np=None)
    assert plan is not None and plan.round_id == 1
    assert ids(plan) == ["w0", "w1", "w2"]  # host order, then slot
    assert ranks(plan) == [("w0", 0, 0, 2, 0, 2), ("w1", 1, 1, 2, 0, 1), ("w2", 2, 0, 1, 1, 2)]


def test_first_round_waits_for_min_np():
    assert next_plan(None, ws("w0@a/0"), hs("a:2"), min_np=2, max_np=None) is None
    assert next_plan(None, [], hs("a:2"), min_np=1, max_np=None) is None


@pytest.mark.parametrize(
    "previous, live, hosts, min_np, max_np, expected",
    [
        # nothing changed: same members, new round number
        ("w0@a/0,w1@a/1", "w0@a/0,w1@a/1", "a:2", 1, None, ["w0", "w1"]),
        # rank 0 died: the oldest survivor becomes rank 0, the replacement goes last
        ("w0@a/0,w1@a/1,w2@b/0", "w1@a/1,w2@b/0,w3@a/0", "a:2,b:1", 1, None, ["w1", "w2", "w3"]),
        # survivors keep their relative order even when it differs from host/slot order
        ("w5@b/0,w1@a/1,w0@a/0", "w0@a/0,w1@a/1,w5@b/0", "a:2,b:1", 1, None, ["w5", "w1", "w0"]),
        # new workers are ordered by host order then slot, not by registration or id
        ("w0@a/0", "w0@a/0,w9@c/0,w8@b/1,w7@b/0", "a:1,b:2,c:1", 1, None, ["w0", "w7", "w8", "w9"]),
        # a removed host's survivors drop out
        ("w0@a/0,w1@b/0,w2@b/1", "w0@a/0,w1@b/0,w2@b/1", "a:1", 1, None, ["w0"]),
        # a host shrinking drops the slots past its count
        ("w0@a/0,w1@a/1,w2@a/2", "w0@a/0,w1@a/1,w2@a/2", "a:2", 1, None, ["w0", "w1"]),
        # max_np: survivors first, then as many new workers as fit
        ("w0@a/0,w1@a/1", "w0@a/0,w1@a/1,w2@b/0,w3@b/1", "a:2,b:2", 1, 3, ["w0", "w1", "w2"]),
        # max_np lowered below the survivors: the oldest survivors are kept
        ("w0@a/0,w1@a/1,w2@b/0", "w0@a/0,w1@a/1,w2@b/0", "a:2,b:1", 1, 2, ["w0", "w1"]),
        # too few after failures
        ("w0@a/0,w1@a/1,w2@b/0", "w2@b/0", "a:2,b:1", 2, None, None),
        # a dead member's replacement on the same slot is a newcomer
        ("w0@a/0,w1@a/1", "w1@a/1,w4@a/0", "a:2", 2, None, ["w1", "w4"]),
        # two live workers claim one slot: the survivor wins over the replacement
        ("w0@a/0,w1@a/1", "w0@a/0,w1@a/1,w4@a/0", "a:2", 1, None, ["w0", "w1"]),
        # ... and between newcomers the first registered wins
        ("w1@a/1", "w1@a/1,w5@a/0,w4@a/0", "a:2", 1, None, ["w1", "w5"]),
        # a blacklisted host (left out of hosts) loses its workers
        ("w0@a/0,w1@b/0", "w0@a/0,w1@b/0", "b:1", 1, None, ["w1"]),
        # no hosts at all
        ("w0@a/0", "w0@a/0", "", 1, None, None),
    ],
)
def test_next_plan(previous, live, hosts, min_np, max_np, expected):
    previous_plan = build_plan(4, ws(previous))
    plan = next_plan(previous_plan, ws(live), hs(hosts), min_np, max_np)
    assert ids(plan) == expected
    if plan is not None:
        assert plan.round_id == 5


def test_duplicate_worker_ids_count_once():
    live = ws("w0@a/0") * 2
    assert ids(next_plan(None, live, hs("a:2"), 1, None)) == ["w0"]


def test_survivor_uses_its_live_registration():
    previous = build_plan(1, ws("w0@a/0"))
    plan = next_plan(previous, ws("w0@a/0"), hs("a:1"), 1, None)
    assert plan is not None and plan.members[0].address == "a:7000"


@pytest.mark.parametrize("min_np, max_np", [(0, None), (-1, 3), (3, 2)])
def test_next_plan_rejects_bad_bounds(min_np, max_np):
    with pytest.raises(ValueError):
        next_plan(None, ws("w0@a/0"), hs("a:1"), min_np, max_np)


# ----------------------------------------------------------------------------- round decisions


def test_needs_new_round():
    p1 = build_plan(1, ws("w0@a/0,w1@a/1"))
    same = build_plan(2, ws("w0@a/0,w1@a/1"))
    reordered = build_plan(2, ws("w1@a/1,w0@a/0"))
    smaller = build_plan(2, ws("w0@a/0"))
    assert needs_new_round(None, p1)
    assert not needs_new_round(None, None)
    assert not needs_new_round(p1, None)
    assert not needs_new_round(p1, same)
    assert needs_new_round(p1, reordered)
    assert needs_new_round(p1, smaller)


def test_round_is_intact():
    plan = build_plan(1, ws("w0@a/0,w1@b/0"))
    assert round_is_intact(plan, ws("w0@a/0,w1@b/0,w2@b/1"), hs("a:1,b:2"))
    assert not round_is_intact(plan, ws("w0@a/0"), hs("a:1,b:2"))  # w1 died
    assert not round_is_intact(plan, ws("w0@a/0,w1@b/0"), hs("a:1"))  # b removed
    assert round_is_intact(Plan(round_id=1), [], ())


# ----------------------------------------------------------------------------- properties


@st.composite
def scenarios(draw):
    """Hosts, a previous plan built from earlier workers, and the live workers now."""
    names = draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=5, unique=True))
    hosts = tuple(HostSlots(n, draw(st.integers(1, 4))) for n in names)
    # Most workers sit on allowed slots; some on hosts or slots that are no longer allowed.
    allowed = [(h.host, s) for h in hosts for s in range(h.slots)]
    strays = [("g", 0), ("a", 4), ("b", 4)]
    place = st.sampled_from(allowed) if allowed else st.sampled_from(strays)
    place = st.one_of(place, place, place, st.sampled_from(strays))
    places = draw(st.lists(place, min_size=1, max_size=16))
    workers = [worker(f"w{i}", h, s) for i, (h, s) in enumerate(places)]
    previous = None
    if workers and draw(st.integers(0, 3)):
        chosen = draw(st.permutations(workers))[: draw(st.integers(0, len(workers)))]
        # a previous plan never has two members on one slot
        seen, members = set(), []
        for w in chosen:
            if (w.host, w.slot) not in seen:
                seen.add((w.host, w.slot))
                members.append(w)
        previous = build_plan(draw(st.integers(1, 50)), members)
    alive = draw(
        st.lists(
            st.sampled_from([True, True, True, False]),  # most live on
            min_size=len(workers),
            max_size=len(workers),
        )
    )
    live = draw(st.permutations([w for w, up in zip(workers, alive) if up]))
    min_np = draw(st.integers(1, 3))
    max_np = draw(st.one_of(st.none(), st.integers(min_np, 12)))
    return previous, live, hosts, min_np, max_np


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_next_plan_invariants(scenario):
    previous, live, hosts, min_np, max_np = scenario
    plan = next_plan(previous, live, hosts, min_np, max_np)
    allowed = set(allowed_slots(hosts))
    eligible_slots = {(w.host, w.slot) for w in live if (w.host, w.slot) in allowed}
    if plan is None:
        assert len(eligible_slots) < min_np or (max_np is not None and max_np < min_np)
        return
    members = plan.members
    n = len(members)
    # size bounds; rank numbering
    assert min_np <= n and (max_np is None or n <= max_np)
    assert n == min(len(eligible_slots), max_np if max_np is not None else n + len(eligible_slots))
    assert [m.rank for m in members] == list(range(n))
    assert plan.round_id == (previous.round_id + 1 if previous else 1)
    # members are live, on allowed slots, one per slot, each worker once
    live_ids = {w.worker_id for w in live}
    assert all(m.worker_id in live_ids and (m.host, m.slot) in allowed for m in members)
    assert len({(m.host, m.slot) for m in members}) == n
    assert len(set(plan.worker_ids)) == n
    # survivors first, in their old relative order
    old_ids = list(previous.worker_ids) if previous else []
    survivor_flags = [i in old_ids for i in plan.worker_ids]
    assert survivor_flags == sorted(survivor_flags, reverse=True)
    kept = [i for i in plan.worker_ids if i in old_ids]
    assert kept == [i for i in old_ids if i in kept]
    # every survivor that is live and allowed is kept unless max_np cut it
    live_allowed_survivors = [
        i for i in old_ids if any(w.worker_id == i and (w.host, w.slot) in allowed for w in live)
    ]
    if max_np is None or len(live_allowed_survivors) <= max_np:
        assert kept == live_allowed_survivors
    # newcomers in host order then slot
    position = {s: i for i, s in enumerate(allowed_slots(hosts))}
    new_positions = [
        position[WorkerSlot(m.host, m.slot)] for m in members if m.worker_id not in old_ids
    ]
    assert new_positions == sorted(new_positions)
    # local ranks: 0..local_size-1 per host, in rank order
    by_host: dict[str, list[Member]] = {}
    for m in members:
        by_host.setdefault(m.host, []).append(m)
    for host_members in by_host.values():
        assert [m.local_rank for m in host_members] == list(range(len(host_members)))
        assert all(m.local_size == len(host_members) for m in host_members)
    # cross ranks: 0..cross_size-1 among workers with the same local rank, in rank order
    by_local: dict[int, list[Member]] = {}
    for m in members:
        by_local.setdefault(m.local_rank, []).append(m)
    for local_members in by_local.values():
        assert [m.cross_rank for m in local_members] == list(range(len(local_members)))
        assert all(m.cross_size == len(local_members) for m in local_members)
        assert len({m.host for m in local_members}) == len(local_members)
    assert len({(m.local_rank, m.cross_rank) for m in members}) == n
    # the plan round-trips through the store's JSON
    assert Plan.from_json(plan.to_json()) == plan


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_replanning_with_the_same_inputs_changes_nothing(scenario):
    previous, live, hosts, min_np, max_np = scenario
    plan = next_plan(previous, live, hosts, min_np, max_np)
    if plan is not None:
        again = next_plan(plan, live, hosts, min_np, max_np)
        assert again is not None and not needs_new_round(plan, again)
        assert again.round_id == plan.round_id + 1


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_filled_slots_reach_the_cap_and_plan(scenario):
    _, live, hosts, _, max_np = scenario
    occupied = [(w.host, w.slot) for w in live]
    fill = free_slots(hosts, occupied, max_np)
    allowed = allowed_slots(hosts)
    occupied_allowed = set(occupied) & set(allowed)
    assert not set(fill) & occupied_allowed
    assert len(set(fill)) == len(fill)
    assert set(fill) <= set(allowed)
    total = len(occupied_allowed) + len(fill)
    assert total == (
        len(allowed) if max_np is None else max(len(occupied_allowed), min(max_np, len(allowed)))
    )
    # launching those fills the job: a plan from live + new workers has max(min(...)) members
    new_workers = [worker(f"n{i}", h, s) for i, (h, s) in enumerate(fill)]
    if total:
        plan = next_plan(None, list(live) + new_workers, hosts, 1, max_np)
        assert plan is not None and plan.size == (total if max_np is None else min(total, max_np))


@pytest.mark.parametrize(
    "intact,ages,holds",
    [
        (True, [], False),
        (True, [0.5], True),
        (True, [5.0], False),
        (True, [5.0, 0.1], True),
        (False, [0.1], False),
        (False, [], False),
    ],
)
def test_hold_growth_for_joiners(intact, ages, holds):
    from driver.policy.planner import hold_growth_for_joiners

    assert hold_growth_for_joiners(intact, ages, 3.0) is holds
