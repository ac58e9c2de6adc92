"""The embedded store's watch fan-out at the shape of a round (``benchmarks/
rendezvous_scale_bench.py`` measures it at scale): many watches of the round key, a
burst of writes elsewhere (failure reports), then one plan. The writes elsewhere wake
none of the round's watches, and the plan is encoded once for all of them: the store's
work per round grows with the writes and the watchers, not with their product."""

from __future__ import annotations

import pytest

from rendezvous import open_store
from rendezvous.store import PUT, Watch

WATCHES = 100
REPORTS = 200
ROUND = "/fan/round"


def _next_put(watch: Watch, timeout: float = 20.0) -> bytes:
    event = watch.get(timeout=timeout)
    assert event is not None and event.type == PUT, event
    return event.value


@pytest.mark.timeout(60)
def test_writes_wake_only_the_watches_of_their_prefix(embedded_server):
    url = f"embedded://{embedded_server.address}"
    # two connections: a connection carries at most 128 streams
    clients = [open_store(url, embedded_server.secret) for _ in range(2)]
    watches = [clients[i % 2].watch_prefix(ROUND) for i in range(WATCHES)]
    reports = clients[0].watch_prefix("/fan/failures/")
    try:
        clients[0].put(ROUND, b"round 1")
        assert {_next_put(w) for w in watches} == {b"round 1"}  # every stream is open
        woken, encoded = embedded_server.wakeups[ROUND], embedded_server.batches_encoded
        for i in range(REPORTS):
            clients[1].put(f"/fan/failures/1/w{i}", b"{}")
        assert [_next_put(reports) for _ in range(REPORTS)] == [b"{}"] * REPORTS
        plan = b"p" * 50_000
        clients[0].put(ROUND, plan)
        assert all(_next_put(w) == plan for w in watches)
        # One wake-up each for the plan (it was one per watch and write: 20 000).
        assert embedded_server.wakeups[ROUND] - woken <= WATCHES
        # Each report's batch once (one watch), and the plan once (a few times if its
        # watches woke apart), not once per watch.
        assert embedded_server.batches_encoded - encoded <= REPORTS + 5
    finally:
        for w in (*watches, reports):
            w.cancel()
        for c in clients:
            c.close()
