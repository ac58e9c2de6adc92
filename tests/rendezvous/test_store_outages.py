"""etcd outages with real processes: SIGKILL and restart on the same data dir, member failover."""

from __future__ import annotations

import threading
import time

import pytest

from rendezvous import StoreSettings, open_store
from rendezvous.backends.etcd import EtcdStore
from rendezvous.errors import RendezvousConnectionError
from tests.conftest import FAST
from tests.rendezvous.test_store_conformance import drain


def test_client_survives_etcd_kill_and_restart(etcd_single):
    store = open_store(etcd_single.url, settings=FAST)
    watcher = open_store(etcd_single.url, settings=FAST)
    try:
        store.put("/o/before", b"1")
        watch = watcher.watch_prefix("/o/")
        etcd_single.kill(0)
        # A call in the gap either retries until the server is back, or raises the typed
        # error once its deadline passes; it never hangs.
        short = StoreSettings(request_timeout=0.5, retry_deadline=1.0)
        gap_client = open_store(etcd_single.url, settings=short, check=False)
        t0 = time.monotonic()
        with pytest.raises(RendezvousConnectionError):
            gap_client.get("/o/before")
        assert time.monotonic() - t0 < 4
        gap_client.close()

        # A call made during the outage completes once the server is back.
        result: dict[str, int] = {}
        putter = threading.Thread(
            target=lambda: result.setdefault("rev", store.put("/o/gap", b"2"))
        )
        putter.start()
        etcd_single.restart(0)
        putter.join(timeout=FAST.retry_deadline + 5)
        assert "rev" in result, "put during the outage neither finished nor raised"
        store.put("/o/after", b"3")
        kv = store.get("/o/before")
        assert kv is not None and kv.value == b"1"  # same data dir: nothing committed is lost
        evs = drain(watch, 2, timeout=FAST.watch_reconnect_deadline)
        assert [e.key for e in evs] == ["/o/gap", "/o/after"]
        assert watch.get(timeout=0.3) is None  # nothing repeated
        assert watch.reconnects >= 1
        watch.cancel()
    finally:
        store.close()
        watcher.close()


def test_client_moves_to_another_member_when_its_member_dies(tmp_path):
    from tests.support.etcd_cluster import EtcdCluster

    with EtcdCluster(3, tmp_path / "cluster") as cluster:
        store = open_store(cluster.url, settings=FAST)
        watcher = open_store(cluster.url, settings=FAST)
        try:
            assert isinstance(store, EtcdStore) and isinstance(watcher, EtcdStore)
            store.put("/f/a", b"1")
            lease = watcher.grant_lease(3)
            watcher.put("/f/leased", b"x", lease=lease)
            lease.keep_alive(interval=0.5)
            watch = watcher.watch_prefix("/f/")
            first = store.endpoint
            assert watcher.endpoint == first
            cluster.kill(cluster.client_ports.index(first.port))
            t0 = time.monotonic()
            store.put("/f/b", b"2")  # goes to another member
            assert time.monotonic() - t0 < FAST.retry_deadline
            assert store.endpoint != first
            kv = store.get("/f/a")
            assert kv is not None and kv.value == b"1"
            # The watcher's client made no call of its own: its watch moves by itself,
            # and so do its lease's keep-alives (the leased key outlives its 3 s TTL).
            evs = drain(watch, 1, timeout=FAST.watch_reconnect_deadline)
            assert evs[0].key == "/f/b"
            assert watcher.endpoint != first
            end = time.monotonic() + 4
            while time.monotonic() < end:
                assert watch.get(timeout=end - time.monotonic()) is None  # no lease expiry
            assert store.get("/f/leased") is not None
            lease.revoke()
            watch.cancel()
        finally:
            store.close()
            watcher.close()
