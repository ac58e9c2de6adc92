"""A round's plan per host (``rendezvous.host_plan``): what each host reads is its own
members and the few peers they connect to, the bytes of a round grow linearly with N,
and the guarantees of the round protocol hold (one plan per round number, the finish
transaction on the head). Pure units first, then the real stores (embedded and etcd:
a plan of hundreds of hosts is written in batches etcd accepts)."""

from __future__ import annotations

import threading

import pytest

from driver.policy.planner import build_plan
from elastic.rounds import RoundReader
from elastic.worker_reports import record_finish
from rendezvous.host_plan import (
    HEAD_PARTS_MEMBERS,
    INLINE_PARTS,
    LatestParts,
    RoundHead,
    RoundView,
    plan_ops,
    read_view,
    split_plan,
    view_from,
    view_of,
)
from rendezvous.keys import JobKeys
from rendezvous.schema.rounds import Plan
from rendezvous.schema.workers import FinishRecord, WorkerInfo
from rendezvous.store import Delete, Put
from tests.support.rounds import publish_plan


def plan_of(round_id: int, hosts: int, per_host: int = 8, interleave: bool = False) -> Plan:
    """A round of ``hosts`` x ``per_host`` workers (ranks host after host, or dealt
    round-robin over the hosts when ``interleave``)."""
    places = [(h, s) for h in range(hosts) for s in range(per_host)]
    if interleave:
        places = [(h, s) for s in range(per_host) for h in range(hosts)]
    workers = [
        WorkerInfo(f"n{h:04d}-{s}-{h * per_host + s}", f"n{h:04d}", s, 1, f"10.0.{h}.{s}:7000")
        for h, s in places
    ]
    return build_plan(round_id, workers)


@pytest.mark.unit
@pytest.mark.parametrize("interleave", [False, True])
def test_each_host_reads_its_members_and_the_peers_they_connect_to(interleave):
    plan = plan_of(3, hosts=4, per_host=3, interleave=interleave)
    head, parts = split_plan(plan)
    assert head == RoundHead(3, 12, 0, head.digest, parts=tuple(parts.values()))
    assert len(head.digest) == 24  # (12 members: the head carries the parts too)
    assert sorted(parts) == ["n0000", "n0001", "n0002", "n0003"]
    leaders = [min(m.rank for m in plan.members if m.host == h) for h in sorted(parts)]
    for host, part in parts.items():
        view = view_from(head, part.to_json())
        assert view.members == tuple(m for m in plan.members if m.host == host)
        wanted = {(m.rank + d) % 12 for m in view.members for d in (-1, 1)}
        i = sorted(parts).index(host)
        wanted |= {leaders[(i - 1) % 4], leaders[(i + 1) % 4]}
        for rank in wanted:  # each a member's ring neighbour or a neighbouring leader
            assert view.address_of(rank) == plan.members[rank].address
            assert view.worker_at(rank) == plan.members[rank].worker_id
        far = set(range(12)) - wanted - {m.rank for m in view.members}
        assert all(view.address_of(r) is None for r in far)
        assert view.size == 12 and view.round_id == 3


@pytest.mark.unit
def test_a_small_plans_head_carries_the_parts_and_a_host_reads_nothing_more():
    """A small job's worker reads nothing after the head's event (as when the event was
    the whole plan); past ``HEAD_PARTS_MEMBERS`` the head is of a constant size."""
    small = plan_of(2, hosts=2, per_host=HEAD_PARTS_MEMBERS // 2)
    head, parts = split_plan(small)
    assert RoundHead.from_json(head.to_json()) == head and len(head.parts) == 2

    def no_read(key: str):
        raise AssertionError(f"read {key}")

    keys = JobKeys("j")
    for host, part in parts.items():
        assert read_view(no_read, keys, head, host) == RoundView(head, part)
    assert read_view(no_read, keys, head, "elsewhere") == RoundView(head)
    large_head, _ = split_plan(plan_of(2, hosts=2, per_host=HEAD_PARTS_MEMBERS // 2 + 1))
    assert large_head.parts == () and len(large_head.to_json()) < 300


@pytest.mark.unit
def test_a_round_s_bytes_grow_linearly_and_a_host_s_part_not_at_all():
    small, large = plan_of(1, hosts=8), plan_of(1, hosts=512)
    total = {}
    for name, plan in (("small", small), ("large", large)):
        head, parts = split_plan(plan)
        total[name] = len(head.to_json()) * len(parts) + sum(
            len(p.to_json()) for p in parts.values()
        )
    assert 0.9 * 64 <= total["large"] / total["small"] <= 1.1 * 64  # 64 times the workers
    biggest = max(len(p.to_json()) for p in split_plan(large)[1].values())
    assert biggest <= 1.1 * max(len(p.to_json()) for p in split_plan(small)[1].values())


@pytest.mark.unit
def test_a_part_of_another_plan_of_the_same_number_is_no_part_of_this_round():
    plan = plan_of(7, hosts=2)
    other = plan_of(7, hosts=3)  # a driver whose publish of round 7 never committed
    head, _ = split_plan(plan)
    stale = split_plan(other)[1]["n0002"]
    assert view_from(head, stale.to_json()).part is None
    assert view_from(head, None).members == ()
    with pytest.raises(ValueError):
        view_from(head, b"{not json")


@pytest.mark.unit
def test_a_large_plan_is_written_in_transactions_etcd_accepts():
    keys = JobKeys("j")
    before = plan_of(1, hosts=INLINE_PARTS + 1)
    few = plan_ops(keys, plan_of(2, hosts=INLINE_PARTS), previous=plan_of(1, hosts=2))
    assert few.before == () == few.after and len(few.publish) == 2 + INLINE_PARTS
    many = plan_ops(keys, plan_of(2, hosts=512), previous=before)
    assert len(many.publish) == 2 and all(len(b) <= 128 for b in many.before)
    assert sum(len(b) for b in many.before) == 512 and many.after == ()
    written = {op.key for b in many.before for op in b if isinstance(op, Put)}
    assert written == {keys.plan_host(f"n{h:04d}", 2) for h in range(512)}
    # The hosts a plan leaves out lose their parts: with it when few, after it when many.
    shrunk = plan_ops(keys, plan_of(3, hosts=2), previous=before)
    gone = [op for b in shrunk.after for op in b]
    assert len(shrunk.publish) == 2 and len(gone) == INLINE_PARTS - 1
    assert all(isinstance(op, Delete) and op.prefix for op in gone)
    assert {op.key for op in gone} == {
        keys.plan_host_prefix(f"n{h:04d}") for h in range(2, INLINE_PARTS + 1)
    }


@pytest.mark.unit
def test_a_part_its_watch_delivered_is_taken_without_a_read():
    keys = JobKeys("j")
    plan = plan_of(5, hosts=HEAD_PARTS_MEMBERS)  # a head without the parts
    writes = plan_ops(keys, plan, None)
    head = writes.head
    assert not head.parts
    seen = LatestParts()
    for op in writes.publish:
        if isinstance(op, Put) and op.key.startswith(keys.plan_host_prefix("n0003")):
            seen.seen(op.key, op.value)

    def no_reads(key):
        raise AssertionError(f"read {key}")

    assert read_view(no_reads, keys, head, "n0003", seen.get) == view_of(plan, "n0003")
    # The other parity's key (the round before) is no part of this round: read then.
    stale = {keys.plan_host("n0003", 4): seen.get(keys.plan_host("n0003", 5))}
    reads: list[str] = []
    read_view(lambda k: reads.append(k), keys, head, "n0003", stale.get)
    assert reads == [keys.plan_host("n0003", 5), keys.plan_head]


@pytest.mark.timeout(60)
def test_hosts_read_their_part_of_a_large_round_from_the_store(store_backend):
    keys = JobKeys("hostplan")
    store = store_backend.open()
    first, second, third = plan_of(1, hosts=200), plan_of(2, hosts=150), plan_of(3, hosts=150)
    publish_plan(store, keys, first)
    head = RoundHead.from_json(store.get(keys.plan_head).value)
    for host in ("n0000", "n0123", "n0199"):
        assert read_view(store.get, keys, head, host) == view_of(first, host)
    assert Plan.from_json(store.get(keys.round).value) == first  # the record of the job
    # Round 2's parts are written before its head: round 1 reads as before meanwhile.
    writes = plan_ops(keys, second, first)
    for batch in writes.before:
        store.txn([], list(batch))
    assert read_view(store.get, keys, head, "n0123") == view_of(first, "n0123")
    store.txn([], list(writes.publish))
    for batch in writes.after:
        store.txn([], list(batch))
    # The hosts left out lost their parts; round 1 still reads until round 3 is out.
    assert store.get_prefix(keys.plan_host_prefix("n0170"))[0] == []
    assert read_view(store.get, keys, head, "n0000") == view_of(first, "n0000")
    newer = RoundHead.from_json(store.get(keys.plan_head).value)
    left_out = read_view(store.get, keys, newer, "n0170")  # no member there in round 2
    assert left_out == view_of(second, "n0170") and left_out is not None
    assert left_out.members == ()
    publish_plan(store, keys, third, second)
    # Round 1 is over: its parts were overwritten, and a host still reading it is told so.
    assert read_view(store.get, keys, head, "n0000") is None


@pytest.mark.timeout(60)
def test_the_finish_holds_only_while_the_head_is_its_round(store_backend):
    keys = JobKeys("finish")
    store = store_backend.open()
    plan = plan_of(4, hosts=2, per_host=2)
    publish_plan(store, keys, plan)
    closed = threading.Event()
    reader = RoundReader(store, keys, "n0001", closed)
    me = "n0001-0-2"
    view = reader.current()
    assert view is not None and view.member(me) is not None
    newer = plan_of(5, hosts=2, per_host=2)
    publish_plan(store, keys, newer, plan)
    # Round 5 came first: the finish is not recorded, and the worker is told to join it.
    joined = record_finish(store, keys, view, me, 10, reader.current)
    assert joined is not None and joined.round_id == 5 and joined.member(me) is not None
    assert store.get(keys.training_finished) is None
    assert record_finish(store, keys, joined, me, 12, reader.current) is None
    assert FinishRecord.from_json(store.get(keys.training_finished).value) == FinishRecord(
        5, 12, me
    )
    # A far member's address (not in this host's part) is read from the whole plan.
    addresses = reader.addresses(joined)
    assert dict(addresses.items()) == {m.rank: m.address for m in newer.members}
    closed.set()


@pytest.mark.timeout(60)
def test_a_reader_follows_the_head_and_reads_only_newer_rounds(store_backend):
    keys = JobKeys("follow")
    store = store_backend.open()
    publish_plan(store, keys, plan_of(1, hosts=1, per_host=2))
    reader = RoundReader(store, keys, "n0000", threading.Event())
    views, watch = reader.read_and_watch()
    with watch:
        assert [v.round_id for v in views] == [1]
        publish_plan(store, keys, plan_of(2, hosts=1, per_host=2), plan_of(1, hosts=1, per_host=2))
        event = watch.get(timeout=10)
        assert event is not None and event.key == reader.key
        view = reader.view(event.value, newer_than=1)
        assert view is not None and view.round_id == 2 and len(view.members) == 2
        assert reader.view(event.value, newer_than=2) is None  # not newer: not read
