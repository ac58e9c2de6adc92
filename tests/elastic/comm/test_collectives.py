"""Every collective against numpy on random data, for 1 to 4 real processes, over the
TCP ring and over shared memory."""

from __future__ import annotations

import pytest

CASES = [(1, "auto")] + [(n, t) for n in (2, 3, 4) for t in ("tcp", "shm")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,transport", CASES, ids=[f"{n}-{t}" for n, t in CASES])
def test_battery_matches_numpy(workers, n, transport):
    members = workers.spawn(n)
    formed = workers.form(
        members,
        transport=transport,
        connect_timeout=30,
        # small pieces and chunks so the battery's arrays span many
        shm_piece_bytes=64 * 1024,
        chunk_bytes=32 * 1024,
    )
    expected = "local" if n == 1 else transport
    assert [f["transport"] for f in formed] == [expected] * n
    for w in members:
        w.send("battery", seed=n)
    checks = [w.expect("battery", timeout=90)["checks"] for w in members]
    assert len(set(checks)) == 1 and checks[0] > 200
    # An orderly end is not a failure: nobody reports a lost peer.
    for w in members:
        w.send("stats")
    assert [w.expect("stats")["peer_failures"] for w in members] == [0] * n


@pytest.mark.timeout(60)
def test_auto_picks_shared_memory_on_one_host(workers):
    members = workers.spawn(2)
    formed = workers.form(members)
    assert [f["transport"] for f in formed] == ["shm", "shm"]
