"""The hierarchical transport on separate test hosts: shared memory inside each host, a
TCP ring among one leader per host. Real worker processes on real test hosts (network,
UTS, PID and mount namespaces: shared memory works only inside a host), one set of
hosts for the whole module."""

from __future__ import annotations

import signal

import pytest

from tests.support.hosts.netns import running_hosts
from tests.support.jobs import wait_until


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with running_hosts(3, tmp_path_factory.mktemp("hier-hosts")) as made:
        yield made


# Small pieces and chunks, so the battery's arrays span many of both.
SMALL = {"shm_piece_bytes": 64 * 1024, "chunk_bytes": 32 * 1024}


def _place(workers, hosts, counts: list[int], order: list[tuple[int, int]] | None = None):
    """Workers on the test hosts (``counts[i]`` on host i), in rank order: host by host,
    or ``order`` as (host, nth worker on it) pairs."""
    on = [workers.spawn(k, hosts[i]) for i, k in enumerate(counts)]
    if order is None:
        return [w for ws in on for w in ws]
    return [on[h][k] for h, k in order]


@pytest.mark.timeout(90)
def test_auto_picks_by_placement(workers, hosts):
    a0, a1, b0, b1, c0 = _place(workers, hosts, [2, 2, 1])
    # Several hosts, some with more than one member: hierarchical.
    formed = workers.form([a0, a1, b0, b1], round_id=1)
    assert {f["transport"] for f in formed} == {"hier"}
    # One member per host: the TCP ring. All on one test host: shared memory, although
    # every test host runs under the same kernel (and boot id).
    formed = workers.form([a0, b0, c0], round_id=2)
    assert {f["transport"] for f in formed} == {"tcp"}
    formed = workers.form([b0, b1], round_id=3)
    assert {f["transport"] for f in formed} == {"shm"}
    # "shm" across hosts is refused everywhere with a clear error.
    for rank, w in enumerate((a0, b0)):
        w.send(
            "form",
            round=4,
            rank=rank,
            addresses=[a0.address, b0.address],
            settings={"transport": "shm"},
        )
    for w in (a0, b0):
        ev = w.expect("error", timeout=30)
        assert ev["type"] == "ShmUnavailableError" and "cannot share memory" in ev["msg"], ev


LAYOUTS = {
    # two hosts, two members each, ranks host by host
    "2x2": ([2, 2], None),
    # the same, the leaders' network steps on a thread of their own (the default on a
    # host with a CPU to spare: the battery sets it both ways, whatever the machine)
    "2x2-overlap": ([2, 2], None),
    # the same, with only the first host's leader on a network thread: the decision
    # is each leader's own (its host's CPUs), and the hosts must still agree
    "2x2-mixed": ([2, 2], None),
    # uneven hosts with interleaved ranks: host 0 holds ranks 0 and 3, host 2 ranks 2, 4
    "2+1+2": ([2, 1, 2], [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1)]),
    # three members on a host: two of them reduce each piece together
    "3+2": ([3, 2], None),
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_battery_matches_numpy_across_hosts(workers, hosts, layout):
    counts, order = LAYOUTS[layout]
    members = _place(workers, hosts, counts, order)
    overlap = layout.endswith("-overlap")
    mixed = {0: {"leader_overlap": True}} if layout.endswith("-mixed") else None
    formed = workers.form(members, **SMALL, leader_overlap=overlap, overrides=mixed)
    assert {f["transport"] for f in formed} == {"hier"}
    for w in members:
        w.send("battery", seed=len(members))
    checks = [w.expect("battery", timeout=120)["checks"] for w in members]
    assert len(set(checks)) == 1 and checks[0] > 200
    for w in members:
        w.send("stats")
    stats = [w.expect("stats") for w in members]
    assert [s["peer_failures"] for s in stats] == [0] * len(members)
    # Each leader of a host with other members runs its network thread, or none does.
    threads = [s["network_threads"] for s in stats]
    expected = [1, 0, 1, 0] if overlap else [1, 0, 0, 0] if mixed else [0] * len(members)
    assert threads == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "victim, overlap",
    [(2, False), (3, False), (2, True), (3, True)],
    ids=["leader", "non-leader", "leader-overlap", "non-leader-overlap"],
)
def test_sigkill_mid_collective_raises_on_every_survivor_within_1s(workers, hosts, victim, overlap):
    members = _place(workers, hosts, [2, 2])
    workers.form(members, leader_overlap=overlap)
    for w in members:
        w.send("loop", nbytes=1 << 20)
    for w in members:
        w.expect("looping")
    t_kill = members[victim].signal(signal.SIGKILL)
    survivors = [w for i, w in enumerate(members) if i != victim]
    for w in survivors:
        ev = w.expect("raised", timeout=10)
        assert "WorkerLostError" in ev["mro"] and ev["type"] == "PeerLostError", ev
        assert f"rank {victim} lost" in ev["msg"], ev["msg"]
        assert ev["t"] - t_kill < 1.0, f"survivor raised {ev['t'] - t_kill:.3f} s after the kill"
        assert ev["next_type"] == "PeerLostError" and ev["next_s"] < 0.05, ev
    for w in survivors:
        assert w.expect("peer_failure", timeout=5)["rank"] == victim


@pytest.mark.timeout(60)
def test_a_cut_host_is_lost_after_peer_timeout(workers, hosts):
    members = _place(workers, hosts, [2, 2])
    timeout = 1.5
    workers.form(members, peer_timeout=timeout)
    for w in members:
        w.send("loop", nbytes=1 << 20)
    for w in members:
        w.expect("looping")
    try:
        hosts[1].cut()
        for w in members[:2]:
            ev = w.expect("raised", timeout=15)
            assert ev["type"] == "PeerLostError", ev
        # The members of the cut host find themselves cut off too, instead of hanging.
        for w in members[2:]:
            assert "WorkerLostError" in w.expect("raised", timeout=15)["mro"]
    finally:
        hosts[1].restore()


@pytest.mark.timeout(90)
def test_orderly_closes_across_hosts_are_not_failures(workers, hosts):
    members = _place(workers, hosts, [2, 2])
    # Ranks that finish first close while others still read their last bytes.
    for round_id in (1, 2):
        workers.form(members, round_id=round_id)
        for w in members:
            w.send("burst", count=20, elems=[1, 100_000, 2_000_000, 0])
        for w in members:
            ev = w.expect("burst", timeout=60)
            assert ev["ok"], ev["error"]
    # A member of the other host (not its leader) closes from another thread while its
    # call is running: everyone sees an orderly close, nobody a lost peer.
    workers.form(members, round_id=3)
    members[3].send("close_blocked")
    ev = members[3].expect("raised", timeout=10)
    assert ev["type"] == "CommunicatorClosedError" and ev["close_to_raise_s"] < 0.5, ev
    for w in members[:3]:
        w.send("allreduce")
        ev = w.expect("raised", timeout=10)
        assert ev["type"] == "CommunicatorClosedError", ev
        assert "rank 3 closed the communicator" in ev["msg"], ev
    # A leader closes while the leaders' ring is busy: the other leader hears its
    # verdict (closed on purpose) beside the broken connection.
    workers.form(members, round_id=4)
    for i, w in enumerate(members):
        w.send("loop", nbytes=4 << 20, close_after=0.3 if i == 2 else None)
    for w in members:
        w.expect("looping")
    for i, w in enumerate(members):
        ev = w.expect("raised", timeout=10)
        assert ev["type"] == "CommunicatorClosedError", (i, ev)
        assert i == 2 or "rank 2 closed the communicator" in ev["msg"], (i, ev)
    for w in members:
        w.send("stats")
    assert [w.expect("stats")["peer_failures"] for w in members] == [0] * 4


MISMATCHES: list[tuple[str, dict, dict]] = [
    ("shape", {"what": "allreduce", "shape": [3]}, {"what": "allreduce", "shape": [4]}),
    ("kind", {"what": "allreduce"}, {"what": "broadcast", "root": 1}),
    ("root", {"what": "broadcast", "root": 0}, {"what": "broadcast", "root": 3}),
    ("trailing", {"what": "allgather", "shape": [2, 3]}, {"what": "allgather", "shape": [2, 4]}),
]


def _outcome(w, timeout: float = 10.0) -> dict:
    """The worker's next "raised" or "result" event, whichever comes."""
    ev = wait_until(
        lambda: (w.events_named("raised") + w.events_named("result") or [None])[0],
        timeout,
        f"worker {w.pid} to finish its call",
    )
    return w.expect(ev["event"])


@pytest.mark.timeout(90)
def test_hosts_that_disagree_raise_mismatch_everywhere(workers, hosts):
    # Inside each host the members agree: only the leaders can see the difference.
    members = _place(workers, hosts, [2, 2])
    for round_id, (name, a, b) in enumerate(MISMATCHES, start=1):
        workers.form(members, round_id=round_id)
        for i, w in enumerate(members):
            w.send("call", **(a if i < 2 else b))
        for i, w in enumerate(members):
            ev = _outcome(w)
            if ev["event"] == "result":
                # A broadcast whose root is on this member's host can end here before the
                # leaders compare notes (as it can after the root in the TCP ring); the
                # mismatch then breaks the next call.
                assert name == "root" and i % 2 == 1, (name, i, ev)
                w.send("call", what="barrier")
                ev = w.expect("raised", timeout=10)
            assert ev["type"] == "CollectiveMismatchError", (name, ev)
