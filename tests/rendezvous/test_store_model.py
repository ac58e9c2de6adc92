"""Pure-logic unit tests of the store: URL parsing and the in-memory etcd model."""

from __future__ import annotations

import pytest

from rendezvous.backends.memory import MemoryKV, prefix_end
from rendezvous.errors import LeaseNotFoundError, RendezvousConfigError, WatchCompactedError
from rendezvous.net.url import Endpoint, parse_store_url
from rendezvous.schema.rounds import Member, Plan
from rendezvous.schema.workers import WorkerInfo
from rendezvous.store import Compare, Delete, Put

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


@pytest.mark.parametrize(
    "url,scheme,endpoints",
    [
        ("embedded", "embedded", ()),
        ("embedded://127.0.0.1:5", "embedded", (Endpoint("127.0.0.1", 5),)),
        ("etcd://h:2379", "etcd", (Endpoint("h", 2379),)),
        ("etcd://a:1,b:2, c:3", "etcd", (Endpoint("a", 1), Endpoint("b", 2), Endpoint("c", 3))),
        ("etcd://[::1]:2379", "etcd", (Endpoint("::1", 2379),)),
        ("  etcd://h:1/ ", "etcd", (Endpoint("h", 1),)),
    ],
)
def test_parse_good_urls(url, scheme, endpoints):
    parsed = parse_store_url(url)
    assert (parsed.scheme, parsed.endpoints) == (scheme, endpoints)


@pytest.mark.parametrize(
    "url,fragment",
    [
        ("", "empty"),
        ("etcd", "expected"),
        ("http://h:1", "expected"),
        ("etcd://", "empty"),
        ("etcd://h", "HOST:PORT"),
        ("etcd://h:0", "port"),
        ("etcd://h:x", "port"),
        ("etcd://h:70000", "port"),
        ("etcd://a:1,", "empty"),
        ("etcd://[::1]2379", "IPV6"),
        ("etcd://::1:2379", "host"),
        ("embedded://a:1,b:2", "one endpoint"),
        ("etcd://:5", "host"),
    ],
)
def test_parse_bad_urls_name_the_problem(url, fragment):
    with pytest.raises(RendezvousConfigError, match=fragment):
        parse_store_url(url)


def test_url_round_trips():
    for url in ["embedded", "etcd://a:1,b:2", "etcd://[::1]:5", "etcds://a:1,b:2"]:
        assert str(parse_store_url(url)) == url


def test_etcds_is_the_etcd_backend_with_tls_and_says_so_when_written_back():
    """Every "is this etcd?" rule holds for etcds, and the URL handed to the job's
    processes (``str``) asks them for TLS too."""
    url = parse_store_url("etcds://a:1, b:2")
    assert (url.scheme, url.tls, url.url_scheme) == ("etcd", True, "etcds")
    assert url.endpoints == (Endpoint("a", 1), Endpoint("b", 2))
    assert str(url) == "etcds://a:1,b:2"
    assert not parse_store_url("etcd://a:1").tls
    with pytest.raises(RendezvousConfigError, match="etcds://"):
        parse_store_url("etcdtls://a:1")


@pytest.mark.parametrize(
    "tls_required,ca,cert,expected",
    [
        (False, None, None, False),  # etcd://, nothing given: plain
        (False, "ca.pem", None, True),  # etcd:// with a CA: TLS, as before etcds existed
        (False, None, "c.pem", True),  # ... or with a client certificate
        (True, None, None, True),  # etcds://: TLS, the system's roots
        (True, "ca.pem", "c.pem", True),
    ],
)
def test_when_the_etcd_client_speaks_tls(tls_required, ca, cert, expected):
    from rendezvous.backends.etcd import EtcdCredentials

    credentials = EtcdCredentials(
        ca_cert=ca, cert=cert, key="k.pem" if cert else None, tls_required=tls_required
    )
    assert credentials.tls is expected


def test_prefix_end():
    assert prefix_end("/a/") == "/a0"
    assert prefix_end("/a/") > "/a/zzz" and prefix_end("/a/") <= "/a0"


class FakeClock:
    """Time for the pure model (no I/O involved)."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_memory_revisions_versions_and_noop_delete():
    kv = MemoryKV()
    assert kv.revision == 1
    kv.txn([], [Put("/a", b"1")], [])
    kv.txn([], [Put("/a", b"2"), Put("/b", b"x")], [])
    a = kv.range("/a", False)[0][0]
    assert (a.create_revision, a.mod_revision, a.version) == (2, 3, 2)
    kv.txn([], [Delete("/nothing")], [])
    assert kv.revision == 3  # deleting nothing does not move the revision
    kv.txn([], [Delete("/", prefix=True)], [])
    assert kv.range("/", True)[0] == [] and kv.revision == 4


@pytest.mark.parametrize(
    "compare,holds",
    [
        (Compare("/k", "value", "==", b"v"), True),
        (Compare("/k", "value", "!=", b"v"), False),
        (Compare("/k", "version", "==", 1), True),
        (Compare("/k", "mod", ">", 1), True),
        (Compare("/k", "create", "<", 2), False),
        (Compare("/none", "mod", "==", 0), True),
        (Compare("/none", "value", "==", b""), False),
        (Compare("/none", "value", "!=", b""), True),
        (Compare("/none", "version", ">", 0), False),
    ],
)
def test_memory_compares(compare, holds):
    kv = MemoryKV()
    kv.txn([], [Put("/k", b"v")], [])
    assert kv.txn([compare], [Put("/ok", b"")], []).succeeded is holds


def test_bad_compare_is_rejected():
    with pytest.raises(ValueError):
        Compare("/k", "size", "==", 1)
    with pytest.raises(ValueError):
        Compare("/k", "mod", ">=", 1)


def test_memory_lease_expiry_and_keepalive():
    clock = FakeClock()
    kv = MemoryKV(clock=clock)
    lid = kv.grant(5)
    kv.txn([], [Put("/l", b"", lid), Put("/keep", b"")], [])
    clock.now += 4
    assert kv.expire_leases() == 0
    assert kv.keepalive(lid) == 5
    clock.now += 4.9
    assert kv.expire_leases() == 0 and kv.range("/l", False)[0]
    clock.now += 0.2
    assert kv.expire_leases() == 1
    assert kv.range("/l", False)[0] == [] and kv.range("/keep", False)[0]
    with pytest.raises(LeaseNotFoundError):
        kv.keepalive(lid)
    with pytest.raises(LeaseNotFoundError):
        kv.txn([], [Put("/x", b"", lid)], [])


def test_memory_keepalive_after_deadline_but_before_sweep_is_refused():
    clock = FakeClock()
    kv = MemoryKV(clock=clock)
    lid = kv.grant(1)
    clock.now += 1.5
    with pytest.raises(LeaseNotFoundError):
        kv.keepalive(lid)


def test_memory_put_moves_key_between_leases():
    kv = MemoryKV()
    l1, l2 = kv.grant(10), kv.grant(10)
    kv.txn([], [Put("/k", b"1", l1)], [])
    kv.txn([], [Put("/k", b"2", l2)], [])
    kv.revoke(l1)
    assert kv.range("/k", False)[0][0].value == b"2"
    kv.revoke(l2)
    assert kv.range("/k", False)[0] == []


def test_memory_events_since_filters_and_compacts():
    kv = MemoryKV(history_limit=8)
    for i in range(5):
        kv.txn([], [Put(f"/a/{i}", b""), Put(f"/b/{i}", b"")], [])
    events, nxt = kv.events_since("/a/", 4, timeout=0)
    assert [e.key for e in events] == ["/a/2", "/a/3", "/a/4"] and nxt == kv.revision + 1
    assert kv.events_since("/a/", nxt, timeout=0) == ([], nxt)
    for i in range(5, 10):
        kv.txn([], [Put(f"/a/{i}", b"")], [])
    with pytest.raises(WatchCompactedError):
        kv.events_since("/a/", 2, timeout=0)


def test_plan_and_worker_records_round_trip():
    info = WorkerInfo("w1", "h", 0, 123, "127.0.0.1:5")
    assert WorkerInfo.from_json(info.to_json()) == info
    plan = Plan(3, (Member("w1", "h", 0, "a:1", 0, 0, 1, 0, 1),))
    assert Plan.from_json(plan.to_json()) == plan
    member = plan.member("w1")
    assert member is not None and member.rank == 0
    assert plan.member("nope") is None and plan.size == 1
