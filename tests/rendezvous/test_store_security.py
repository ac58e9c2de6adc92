"""etcd with user/password auth and with mutual TLS: credentials from ELASTIC_ETCD_* pass
through to the client; missing or wrong ones give a typed error, never a hang. The
``etcds://`` scheme asks for TLS, trusting the given CA, else the system's roots."""

from __future__ import annotations

import time

import pytest

from rendezvous import StoreSettings, open_store, parse_store_url
from rendezvous.errors import RendezvousAuthError, RendezvousError
from rendezvous.net.url import Endpoint
from tests.conftest import FAST
from tests.support.etcd_cluster import EtcdCluster
from tests.support.pki import tls_etcd, tls_url, write_pki

SHORT = StoreSettings(request_timeout=1.0, retry_deadline=2.0, connect_timeout=3.0)


def test_user_and_password_pass_through(etcd_single, monkeypatch):
    etcd_single.enable_auth("s3cret")
    monkeypatch.delenv("ELASTIC_ETCD_USER", raising=False)
    t0 = time.monotonic()
    with pytest.raises(RendezvousAuthError, match="ELASTIC_ETCD_USER"):
        open_store(etcd_single.url, settings=SHORT)
    monkeypatch.setenv("ELASTIC_ETCD_USER", "root")
    monkeypatch.setenv("ELASTIC_ETCD_PASSWORD", "wrong")
    with pytest.raises(RendezvousAuthError, match="root"):
        open_store(etcd_single.url, settings=SHORT)
    assert time.monotonic() - t0 < 10
    monkeypatch.setenv("ELASTIC_ETCD_PASSWORD", "s3cret")
    store = open_store(etcd_single.url, settings=FAST)
    try:
        with store.watch_prefix("/auth/") as watch:
            lease = store.grant_lease(5)
            store.put("/auth/k", b"v", lease=lease)
            assert watch.get(timeout=5).key == "/auth/k"
            assert lease.refresh() > 0
        kv = store.get("/auth/k")
        assert kv is not None and kv.value == b"v"
    finally:
        store.close()


def test_mutual_tls_pass_through(tmp_path, monkeypatch):
    pki = write_pki(tmp_path)
    monkeypatch.setenv("ELASTIC_ETCD_CA_CERT", pki["ca"])
    monkeypatch.setenv("ELASTIC_ETCD_CERT", pki["client_cert"])
    monkeypatch.setenv("ELASTIC_ETCD_KEY", pki["client_key"])
    with EtcdCluster(1, tmp_path / "etcd", tls=pki) as cluster:
        store = open_store(cluster.url, settings=FAST)
        try:
            store.put("/tls/k", b"v")
            kv = store.get("/tls/k")
            assert kv is not None and kv.value == b"v"
        finally:
            store.close()
        # Without a client certificate the server refuses the connection: a typed error, fast.
        monkeypatch.delenv("ELASTIC_ETCD_CERT")
        monkeypatch.delenv("ELASTIC_ETCD_KEY")
        t0 = time.monotonic()
        with pytest.raises(RendezvousError):
            open_store(cluster.url, settings=SHORT)
        assert time.monotonic() - t0 < 10


def test_bad_credential_settings_are_named(monkeypatch, tmp_path):
    from rendezvous.errors import RendezvousConfigError

    monkeypatch.setenv("ELASTIC_ETCD_CERT", str(tmp_path / "c.pem"))
    with pytest.raises(RendezvousConfigError, match="ELASTIC_ETCD_KEY"):
        open_store("etcd://127.0.0.1:1", settings=SHORT)
    monkeypatch.setenv("ELASTIC_ETCD_KEY", str(tmp_path / "k.pem"))
    with pytest.raises(RendezvousConfigError, match="cannot read"):
        open_store("etcd://127.0.0.1:1", settings=SHORT)


@pytest.fixture
def tls_cluster(tmp_path):
    with tls_etcd(tmp_path / "pki") as (cluster, pki):
        yield cluster, pki


def _client_certificate_only(monkeypatch, pki) -> None:
    """The environment holds the client certificate and key, and no CA file."""
    for name in ("ELASTIC_ETCD_USER", "ELASTIC_ETCD_PASSWORD", "ELASTIC_ETCD_CA_CERT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ELASTIC_ETCD_CERT", pki["client_cert"])
    monkeypatch.setenv("ELASTIC_ETCD_KEY", pki["client_key"])


def _round_trip(url: str, key: str) -> None:
    store = open_store(url, settings=FAST)
    try:
        store.put(key, b"v")
        kv = store.get(key)
        assert kv is not None and kv.value == b"v"
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_etcds_trusts_the_given_ca_else_the_systems_roots(tls_cluster, monkeypatch, tmp_path):
    cluster, pki = tls_cluster
    url = tls_url(cluster)
    _client_certificate_only(monkeypatch, pki)
    monkeypatch.setenv("ELASTIC_ETCD_CA_CERT", pki["ca"])
    _round_trip(url, "/etcds/given-ca")
    # No CA file: the roots this machine trusts, from the bundle OpenSSL reads
    # (SSL_CERT_FILE, as an operator who installed the CA machine-wide would have it).
    monkeypatch.delenv("ELASTIC_ETCD_CA_CERT")
    monkeypatch.setenv("SSL_CERT_FILE", pki["ca"])
    _round_trip(url, "/etcds/system-roots")
    # Roots that do not hold etcd's CA: refused, a typed error, and soon.
    other = write_pki(tmp_path / "other")
    monkeypatch.setenv("SSL_CERT_FILE", other["ca"])
    t0 = time.monotonic()
    with pytest.raises(RendezvousError):
        open_store(url, settings=SHORT)
    assert time.monotonic() - t0 < 10


@pytest.mark.timeout(60)
def test_the_tls_probe_tells_a_tls_etcd_from_a_plain_one(tls_cluster, etcd_server):
    from rendezvous.net.tls_probe import speaks_tls
    from tests.support.etcd_cluster import free_ports

    cluster, _ = tls_cluster
    (tls,) = parse_store_url(cluster.url).endpoints
    (plain,) = parse_store_url(etcd_server.url).endpoints
    assert speaks_tls(tls) is True  # it asks for a client certificate: still TLS
    assert speaks_tls(plain) is False
    (closed,) = free_ports(1)
    assert speaks_tls(Endpoint("127.0.0.1", closed), timeout=1.0) is None
