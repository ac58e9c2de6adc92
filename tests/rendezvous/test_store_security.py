"""etcd with user/password auth and with mutual TLS: credentials from ELASTIC_ETCD_* pass
through to the client; missing or wrong ones give a typed error, never a hang."""

from __future__ import annotations

import datetime
import ipaddress
import time

import pytest

from rendezvous import StoreSettings, open_store
from rendezvous.errors import RendezvousAuthError, RendezvousError
from tests.conftest import FAST
from tests.support.etcd_cluster import EtcdCluster

SHORT = StoreSettings(request_timeout=1.0, retry_deadline=2.0, connect_timeout=3.0)


def enable_auth(url: str, password: str) -> None:
    """Create etcd's root user and turn authentication on (through etcd's own API)."""
    import grpc
    from etcd3 import etcdrpc

    channel = grpc.insecure_channel(url.split("://", 1)[1])
    try:
        auth = etcdrpc.AuthStub(channel)
        auth.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password=password), timeout=5)
        auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=5)
        auth.AuthEnable(etcdrpc.AuthEnableRequest(), timeout=5)
    finally:
        channel.close()


def test_user_and_password_pass_through(etcd_single, monkeypatch):
    enable_auth(etcd_single.url, "s3cret")
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


def _write_pki(tmp_path):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def issue(subject, key, issuer, issuer_key, ca=False, usage=None, san=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if usage:
            builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def save(stem, cert, key):
        (tmp_path / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (tmp_path / f"{stem}-key.pem").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        return str(tmp_path / f"{stem}.pem"), str(tmp_path / f"{stem}-key.pem")

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = issue("test-ca", ca_key, "test-ca", ca_key, ca=True)
    server_key, client_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    server = issue(
        "127.0.0.1",
        server_key,
        "test-ca",
        ca_key,
        usage=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client = issue("client", client_key, "test-ca", ca_key, usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    ca_path, _ = save("ca", ca, ca_key)
    server_cert, server_key_path = save("server", server, server_key)
    client_cert, client_key_path = save("client", client, client_key)
    return {
        "ca": ca_path,
        "cert": server_cert,
        "key": server_key_path,
        "client_cert": client_cert,
        "client_key": client_key_path,
    }


def test_mutual_tls_pass_through(tmp_path, monkeypatch):
    pki = _write_pki(tmp_path)
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
