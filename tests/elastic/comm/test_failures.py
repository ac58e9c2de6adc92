"""No collective hangs on a failure: real SIGKILL and SIGSTOP of worker processes."""

from __future__ import annotations

import signal
from typing import Any

import pytest

TRANSPORTS = ("tcp", "shm")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigkill_during_collectives_raises_on_every_survivor_within_1s(workers, transport):
    members = workers.spawn(4)
    workers.form(members, transport=transport)
    for w in members:
        w.send("loop", nbytes=256 * 1024)
    for w in members:
        w.expect("looping")
    victim = members[2]
    t_kill = victim.signal(signal.SIGKILL)
    for w in members[:2] + members[3:]:
        ev = w.expect("raised", timeout=10)
        assert "WorkerLostError" in ev["mro"] and ev["type"] == "PeerLostError", ev
        assert "rank 2 lost" in ev["msg"], ev["msg"]
        assert ev["t"] - t_kill < 1.0, f"survivor raised {ev['t'] - t_kill:.3f} s after the kill"
        # The communicator stays broken: the next call raises at once.
        assert ev["next_type"] == "PeerLostError" and ev["next_s"] < 0.05, ev
    # Each survivor's hook fired once with the lost rank.
    for w in members[:2] + members[3:]:
        fails = [w.expect("peer_failure", timeout=5)]
        assert fails[0]["rank"] == 2
        w.send("stats")
        assert w.expect("stats")["peer_failures"] == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigkill_while_survivors_are_idle_breaks_them_within_1s(workers, transport):
    members = workers.spawn(3)
    workers.form(members, transport=transport)
    t_kill = members[0].signal(signal.SIGKILL)
    for w in members[1:]:
        ev = w.expect("peer_failure", timeout=10)
        assert ev["t"] - t_kill < 1.0 and ev["rank"] == 0, ev
    for w in members[1:]:
        w.send("allreduce")
        ev = w.expect("raised", timeout=10)
        assert ev["type"] == "PeerLostError" and ev["wait_s"] < 0.05, ev


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigstop_is_declared_lost_after_peer_timeout(workers, transport):
    members = workers.spawn(3)
    timeout = 1.5
    workers.form(members, transport=transport, peer_timeout=timeout)
    for w in members:
        w.send("loop", nbytes=64 * 1024)
    for w in members:
        w.expect("looping")
    stopped = members[1]
    t_stop = stopped.signal(signal.SIGSTOP)
    for w in (members[0], members[2]):
        ev = w.expect("raised", timeout=15)
        elapsed = ev["t"] - t_stop
        assert ev["type"] == "PeerLostError" and "rank 1 lost" in ev["msg"], ev
        assert timeout * 0.9 <= elapsed < timeout + 2.0, elapsed
    # Once it runs again, the stopped worker finds itself excluded instead of hanging.
    stopped.signal(signal.SIGCONT)
    ev = stopped.expect("raised", timeout=15)
    assert "WorkerLostError" in ev["mro"], ev


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_slow_but_alive_peer_is_not_declared_lost(workers, transport):
    members = workers.spawn(2)
    workers.form(members, transport=transport, peer_timeout=1.0)
    members[0].send("allreduce", value=1.0)
    # Rank 1 computes (pure Python, holding the GIL) for 3x the peer timeout first.
    members[1].send("allreduce", value=2.0, busy_s=3.0)
    for w in members:
        ev = w.expect("result", timeout=20)
        assert ev["sum"] == 3.0
    for w in members:
        w.send("stats")
        assert w.expect("stats")["peer_failures"] == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_close_from_another_thread_unblocks_the_call_and_peers_see_an_orderly_close(
    workers, transport
):
    members = workers.spawn(3)
    workers.form(members, transport=transport)
    members[0].send("close_blocked")
    ev = members[0].expect("raised", timeout=10)
    assert ev["type"] == "CommunicatorClosedError" and "WorkerLostError" in ev["mro"], ev
    assert ev["close_to_raise_s"] < 0.5, ev
    for w in members[1:]:
        w.send("allreduce")
        ev = w.expect("raised", timeout=10)
        assert ev["type"] == "CommunicatorClosedError", ev
        assert "rank 0 closed the communicator" in ev["msg"], ev
        w.send("stats")
        assert w.expect("stats")["peer_failures"] == 0


@pytest.mark.timeout(90)
def test_rounds_reuse_the_listener_after_a_failure_and_a_join(workers):
    a, b, c = workers.spawn(3)
    workers.form([a, b, c], round_id=1)
    for w in (a, b, c):
        w.send("allreduce", value=1.0)
    assert [w.expect("result")["sum"] for w in (a, b, c)] == [3.0] * 3
    c.signal(signal.SIGKILL)
    for w in (a, b):
        w.expect("peer_failure", timeout=10)
    # Round 2: the survivors, on the listeners they opened at start.
    workers.form([b, a], round_id=2)
    for w, v in ((a, 1.0), (b, 2.0)):
        w.send("allreduce", value=v)
    assert [w.expect("result")["sum"] for w in (a, b)] == [3.0, 3.0]
    # Round 3: a newcomer joins.
    (d,) = workers.spawn(1)
    formed = workers.form([a, b, d], round_id=3, transport="tcp")
    assert {f["transport"] for f in formed} == {"tcp"}
    for w in (a, b, d):
        w.send("allreduce", value=1.0)
    assert [w.expect("result")["sum"] for w in (a, b, d)] == [3.0] * 3


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_closing_right_after_the_last_collective_is_not_a_failure(workers, transport):
    # Ranks that finish first close while the others still read their last bytes: that
    # must neither fail the others' collectives nor be reported as a lost peer.
    members = workers.spawn(3)
    for round_id in (1, 2, 3):
        workers.form(members, round_id=round_id, transport=transport)
        for w in members:
            w.send("burst", count=20, elems=[1, 100_000, 2_000_000, 0])
        for w in members:
            ev = w.expect("burst", timeout=60)
            assert ev["ok"], ev["error"]
    for w in members:
        w.send("stats")
        assert w.expect("stats")["peer_failures"] == 0


# (name, rank 0's call, rank 1's call)
MISMATCHES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("shape", {"what": "allreduce", "shape": [3]}, {"what": "allreduce", "shape": [4]}),
    ("dtype", {"what": "allreduce", "dtype": "float32"}, {"what": "allreduce", "dtype": "int64"}),
    ("op", {"what": "allreduce", "op": "sum"}, {"what": "allreduce", "op": "max"}),
    ("kind", {"what": "allreduce"}, {"what": "broadcast", "root": 1}),
    ("root", {"what": "broadcast", "root": 0}, {"what": "broadcast", "root": 1}),
    ("barrier", {"what": "barrier"}, {"what": "allgather"}),
    ("trailing", {"what": "allgather", "shape": [2, 3]}, {"what": "allgather", "shape": [2, 4]}),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mismatched_collectives_raise_everywhere_instead_of_hanging(workers, transport):
    members = workers.spawn(2)
    for round_id, (name, a, b) in enumerate(MISMATCHES, start=1):
        workers.form(members, round_id=round_id, transport=transport)
        members[0].send("call", **a)
        members[1].send("call", **b)
        for w in members:
            ev = w.expect("raised", timeout=10)
            assert ev["type"] == "CollectiveMismatchError", (name, ev)
