"""One conformance suite for every store backend (embedded gRPC server, real etcd)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rendezvous import Compare, Delete, Event, Put, StoreSettings, open_store
from rendezvous.errors import (
    LeaseNotFoundError,
    RendezvousAuthError,
    RendezvousConfigError,
    RendezvousConnectionError,
    RendezvousError,
    ValueTooLargeError,
)
from rendezvous.store import DELETE, PUT
from rendezvous.watch import follow_in_thread
from tests.support.etcd_cluster import free_ports


def drain(watch, count, timeout=10.0):
    """The next ``count`` events of ``watch`` (fails if they do not come in time)."""
    events: list[Event] = []
    deadline = time.monotonic() + timeout
    while len(events) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"got {len(events)} of {count} events: {events}"
        ev = watch.get(timeout=remaining)
        if ev is not None:
            events.append(ev)
    return events


def test_put_get_revisions_and_versions(store_backend):
    s = store_backend.open()
    r1 = s.put("/t/a", b"1")
    r2 = s.put("/t/a", b"2")
    assert r2 > r1
    kv = s.get("/t/a")
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (b"2", r1, r2, 2)
    assert s.get("/t/missing") is None
    assert s.revision() >= r2


def test_get_prefix_is_sorted_and_bounded(store_backend):
    s = store_backend.open()
    for k in ["/p/b", "/p/a", "/p/c/d", "/pp", "/o"]:
        s.put(k, k.encode())
    kvs, rev = s.get_prefix("/p/")
    assert [kv.key for kv in kvs] == ["/p/a", "/p/b", "/p/c/d"]
    assert rev == s.revision()


def test_delete_and_delete_prefix(store_backend):
    s = store_backend.open()
    for k in ["/d/1", "/d/2", "/d/3/x", "/dd"]:
        s.put(k, b"v")
    s.delete("/d/1")
    assert s.get("/d/1") is None
    s.delete_prefix("/d/")
    assert s.get_prefix("/d/")[0] == []
    assert s.get("/dd").value == b"v"
    s.delete("/never")  # deleting nothing is fine


def test_txn_branches_and_atomicity(store_backend):
    s = store_backend.open()
    rev = s.put("/x/k", b"v1")
    ok = s.txn(
        [Compare("/x/k", "value", "==", b"v1"), Compare("/x/k", "mod", "==", rev)],
        [Put("/x/k", b"v2"), Put("/x/other", b"o"), Delete("/x/gone")],
        [Put("/x/failed", b"f")],
    )
    assert ok.succeeded
    a, b = s.get("/x/k"), s.get("/x/other")
    assert a.mod_revision == b.mod_revision == ok.revision  # one revision for the whole txn
    bad = s.txn(
        [Compare("/x/k", "version", ">", 5)], [Put("/x/k", b"no")], [Put("/x/failed", b"f")]
    )
    assert not bad.succeeded
    assert s.get("/x/k").value == b"v2" and s.get("/x/failed").value == b"f"
    assert s.txn([Compare("/x/absent", "create", "==", 0)], [Put("/x/absent", b"n")]).succeeded
    assert not s.txn([Compare("/x/absent2", "value", "==", b"")], [Put("/x/z", b"z")]).succeeded


def test_compare_and_swap(store_backend):
    s = store_backend.open()
    assert s.compare_and_swap("/cas", b"a", 0)
    assert not s.compare_and_swap("/cas", b"b", 0)
    rev = s.get("/cas").mod_revision
    assert not s.compare_and_swap("/cas", b"c", rev + 100)
    assert s.compare_and_swap("/cas", b"d", rev)
    assert s.get("/cas").value == b"d"


def test_concurrent_cas_has_one_winner_per_round(store_backend):
    clients = [store_backend.open() for _ in range(8)]
    barrier = threading.Barrier(8, timeout=20)

    def contend(client, round_no):
        barrier.wait()
        current = client.get("/race")
        expected = current.mod_revision if current else 0
        if current is not None and current.value.startswith(f"{round_no}:".encode()):
            return False  # someone already won this round before we read
        return client.compare_and_swap("/race", f"{round_no}:{id(client)}".encode(), expected)

    with ThreadPoolExecutor(8) as pool:
        for round_no in range(10):
            wins = list(pool.map(lambda c, r=round_no: contend(c, r), clients, timeout=30))
            assert sum(wins) == 1, f"round {round_no}: {sum(wins)} winners"
            assert s_value(clients[0]).startswith(f"{round_no}:".encode())


def s_value(client):
    return client.get("/race").value


def test_lease_keys_vanish_on_revoke(store_backend):
    s = store_backend.open()
    lease = s.grant_lease(30)
    s.put("/l/a", b"1", lease=lease)
    s.put("/l/b", b"2", lease=lease)
    s.put("/l/c", b"3")
    lease.revoke()
    assert [kv.key for kv in s.get_prefix("/l/")[0]] == ["/l/c"]
    with pytest.raises(LeaseNotFoundError):
        s.keepalive(lease.id)


def test_lease_expiry_within_ttl_plus_one_second(store_backend):
    s = store_backend.open()
    ttl = 2
    lease = s.grant_lease(ttl)
    s.put("/exp/k", b"v", lease=lease)
    watch = s.watch_prefix("/exp/")
    # Keep it alive past its TTL: the key must survive.
    lease.keep_alive(interval=0.3)
    t_end = time.monotonic() + ttl + 1
    while time.monotonic() < t_end:
        assert watch.get(timeout=t_end - time.monotonic()) is None  # no delete while kept alive
    lease.stop_keep_alive()
    stopped = time.monotonic()
    ev = watch.get(timeout=ttl + 3)
    gone_after = time.monotonic() - stopped
    watch.cancel()
    assert ev is not None and ev.type == DELETE and ev.key == "/exp/k"
    assert gone_after <= ttl + 1, f"key outlived its lease by {gone_after - ttl:.2f}s"
    assert s.get("/exp/k") is None
    with pytest.raises(LeaseNotFoundError):
        lease.refresh()


def test_put_under_unknown_lease_is_refused(store_backend):
    s = store_backend.open()
    with pytest.raises(LeaseNotFoundError):
        s.put("/k", b"v", lease=0x7777777)


def test_watch_from_revision_replays_history_in_order(store_backend):
    s = store_backend.open()
    start = s.put("/w/a", b"1")
    s.put("/w/b", b"2")
    s.put("/other", b"x")
    s.delete("/w/a")
    with s.watch_prefix("/w/", start_revision=start) as watch:
        evs = drain(watch, 3)
        assert [(e.type, e.key) for e in evs] == [(PUT, "/w/a"), (PUT, "/w/b"), (DELETE, "/w/a")]
        assert [e.revision for e in evs] == sorted(e.revision for e in evs)
        s.put("/w/c", b"3")
        assert drain(watch, 1)[0].key == "/w/c"
        assert watch.get(timeout=0.3) is None


def test_watch_resumed_from_revision_on_a_new_client_loses_and_repeats_nothing(store_backend):
    writer = store_backend.open()
    first = store_backend.open()
    watch = first.watch_prefix("/r/")
    for i in range(5):
        writer.put(f"/r/{i}", b"v")
    seen = drain(watch, 5)
    watch.cancel()
    first.close()
    for i in range(5, 10):  # written while nobody watches
        writer.put(f"/r/{i}", b"v")
    second = store_backend.open()
    with second.watch_prefix("/r/", start_revision=seen[-1].revision + 1) as resumed:
        rest = drain(resumed, 5)
        assert resumed.get(timeout=0.3) is None
    assert [e.key for e in seen + rest] == [f"/r/{i}" for i in range(10)]


def test_bad_url_is_a_config_error(store_backend):
    for url in [
        "",
        "zk://h:1",
        "etcd://",
        "etcd://host",
        "etcd://h:99999",
        "etcd://h:1,,h:2",
        "embedded://a:1,b:2",
        "etcd://:12",
    ]:
        with pytest.raises(RendezvousConfigError):
            open_store(url, store_backend.secret)


def test_unreachable_endpoint_fails_fast_with_typed_error(store_backend):
    port = free_ports(1)[0]
    url = f"{store_backend.name}://127.0.0.1:{port}"
    settings = StoreSettings(request_timeout=1.0, retry_deadline=2.0, connect_timeout=2.0)
    t0 = time.monotonic()
    with pytest.raises(RendezvousConnectionError, match="cannot reach"):
        open_store(url, "s", settings)
    assert time.monotonic() - t0 < 6


def test_oversized_value_is_refused_before_sending(store_backend):
    s = store_backend.open()
    big = b"x" * (s.settings.max_value_bytes + 1)
    with pytest.raises(ValueTooLargeError, match="/big"):
        s.put("/big", big)
    with pytest.raises(ValueTooLargeError):
        s.compare_and_swap("/big", big, 0)
    with pytest.raises(ValueTooLargeError):
        s.txn([], [Put("/big", big)])
    assert s.get("/big") is None
    s.put(
        "/almost", b"x" * (s.settings.max_value_bytes // 2)
    )  # a large but legal value goes through


def test_closed_client_raises_typed_error(store_backend):
    s = store_backend.open()
    s.close()
    with pytest.raises(RendezvousError):
        s.get("/x")


def test_wait_for_blocks_until_condition_or_deadline(store_backend):
    s = store_backend.open()
    other = store_backend.open()
    timer = threading.Timer(0.2, lambda: other.put("/flag", b"go"))
    timer.start()
    try:
        kv = s.wait_for("/flag", lambda kv: kv is not None and kv.value == b"go", timeout=10)
        assert kv.value == b"go"
    finally:
        timer.cancel()
    with pytest.raises(RendezvousConnectionError, match="/never"):
        s.wait_for("/never", lambda kv: kv is not None, timeout=0.3)


# ---- backend-specific parts of the contract ----


def test_embedded_refuses_a_wrong_or_missing_secret(embedded_server):
    url = f"embedded://{embedded_server.address}"
    with pytest.raises(RendezvousAuthError, match="secret"):
        open_store(url, "not-the-secret")
    with pytest.raises(RendezvousConfigError, match="secret"):
        open_store(url, None)
    good = open_store(url, embedded_server.secret)
    good.put("/ok", b"1")
    good.close()


def test_embedded_watch_survives_dropped_streams(embedded_server):
    s = open_store(f"embedded://{embedded_server.address}", embedded_server.secret)
    with s.watch_prefix("/d/") as watch:
        s.put("/d/1", b"1")
        drain(watch, 1)
        embedded_server.drop_watch_streams()
        for i in range(2, 6):
            s.put(f"/d/{i}", b"v")
        evs = drain(watch, 4)
        assert [e.key for e in evs] == [f"/d/{i}" for i in range(2, 6)]
        assert watch.get(timeout=0.3) is None
    s.close()


def test_embedded_server_waits_until_its_watchers_are_gone(embedded_server):
    """``wait_unwatched``: what a node that served a job's store waits for before it
    stops (``driver.join.node.STORE_LINGER``): no watch stream open any more."""
    s = open_store(f"embedded://{embedded_server.address}", embedded_server.secret)
    assert embedded_server.wait_unwatched(0.0)
    with s.watch_prefix("/w/") as watch:
        s.put("/w/1", b"1")
        drain(watch, 1)
        assert not embedded_server.wait_unwatched(0.2)
    assert embedded_server.wait_unwatched(10)
    s.close()


def test_embedded_many_concurrent_clients(embedded_server):
    url = f"embedded://{embedded_server.address}"
    clients = [open_store(url, embedded_server.secret) for _ in range(16)]

    def work(i):
        c = clients[i]
        for j in range(50):
            c.put(f"/many/{i}/{j}", b"v")
            c.txn([Compare("/counter", "version", ">", -1)], [Put(f"/many/t/{i}", b"x")])
        return i

    with ThreadPoolExecutor(16) as pool:
        assert sorted(pool.map(work, range(16), timeout=60)) == list(range(16))
    kvs, _ = clients[0].get_prefix("/many/")
    assert len(kvs) == 16 * 50 + 16
    for c in clients:
        c.close()


def test_watch_delivers_every_event_of_one_revision(store_backend):
    s = store_backend.open()
    with s.watch_prefix("/m/") as watch:
        s.txn([], [Put("/m/a", b"1"), Put("/m/b", b"2"), Put("/m/c", b"3")])
        evs = drain(watch, 3)
        assert [e.key for e in evs] == ["/m/a", "/m/b", "/m/c"]
        assert len({e.revision for e in evs}) == 1
        s.delete_prefix("/m/")
        assert sorted(e.key for e in drain(watch, 3)) == ["/m/a", "/m/b", "/m/c"]
        assert watch.get(timeout=0.3) is None


def test_idle_embedded_watch_advances_past_history_it_does_not_need():
    """A watch on a quiet prefix must not fall behind compaction: heartbeats move its
    resume point, so a reconnect after much unrelated traffic still works."""
    from rendezvous.backends.embedded import WATCH_POLL_SECONDS, EmbeddedServer
    from rendezvous.net.auth import make_secret
    from tests.support.jobs import wait_until

    secret = make_secret()
    server = EmbeddedServer(secret, history_limit=8)
    server.start()
    try:
        s = open_store(f"embedded://{server.address}", secret)
        with s.watch_prefix("/quiet/") as watch:
            for i in range(40):
                s.put(f"/busy/{i}", b"x")
            current = s.revision()
            wait_until(lambda: watch.next_revision > current, 4 * WATCH_POLL_SECONDS, "a heartbeat")
            server.drop_watch_streams()
            s.put("/quiet/k", b"v")
            ev = drain(watch, 1)[0]
            assert ev.key == "/quiet/k"
        s.close()
    finally:
        server.stop()


def test_a_follower_ends_when_its_client_is_closed_under_it(store_backend):
    """``follow_prefix`` on a client closed before its ``stop``: it returns (its watch
    has nothing more to give) instead of asking the ended watch again and again."""
    s = store_backend.open()
    seen: list[str] = []  # from the first read or the watch, whichever saw the put
    first = threading.Event()

    def saw(keys: list[str]) -> None:
        seen.extend(keys)
        if seen:
            first.set()

    thread = follow_in_thread(
        "follower",
        s,
        "/f/",
        on_event=lambda ev: saw([ev.kv.key]),
        on_resync=lambda kvs: saw([kv.key for kv in kvs]),
        on_lost=lambda exc: None,
        stop=threading.Event(),
        patience=5.0,
    )
    s.put("/f/a", b"1")
    assert first.wait(timeout=10)
    assert seen == ["/f/a"]
    s.close()
    thread.join(timeout=5)
    assert not thread.is_alive()
