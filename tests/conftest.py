"""Shared fixtures: real etcd servers, the embedded store server, and both backends.

``store_backend`` parametrizes a test over both backends; it yields a ``StoreBackend``
whose ``open()`` makes clients of one fresh store.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rendezvous import StoreSettings, open_store  # noqa: E402
from rendezvous.auth import make_secret  # noqa: E402
from rendezvous.embedded import EmbeddedServer  # noqa: E402
from tests.etcd_cluster import EtcdCluster  # noqa: E402

# Fixtures that live in their own modules (the real sshd).
pytest_plugins = ["tests.sshd_fixture"]

FAST = StoreSettings(
    request_timeout=2.0, retry_deadline=10.0, connect_timeout=5.0, watch_reconnect_deadline=20.0
)


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory):
    """One etcd server for the session (tests isolate themselves by key prefix)."""
    with EtcdCluster(1, tmp_path_factory.mktemp("etcd")) as cluster:
        yield cluster


@pytest.fixture
def etcd_single(tmp_path):
    """A fresh single-member etcd that a test may kill and restart."""
    with EtcdCluster(1, tmp_path / "etcd") as cluster:
        yield cluster


@pytest.fixture
def embedded_server():
    secret = make_secret()
    server = EmbeddedServer(secret)
    server.start()
    server.secret = secret
    try:
        yield server
    finally:
        server.stop()


@dataclass
class StoreBackend:
    name: str
    url: str
    secret: str | None
    server: object
    _clients: list = field(default_factory=list)

    def open(self, settings: StoreSettings = FAST, secret: str | None = "default"):
        client = open_store(self.url, self.secret if secret == "default" else secret, settings)
        self._clients.append(client)
        return client

    def close_all(self):
        for c in self._clients:
            c.close()


@pytest.fixture(params=["embedded", "etcd"])
def store_backend(request, tmp_path) -> StoreBackend:
    if request.param == "embedded":
        server = request.getfixturevalue("embedded_server")
        backend = StoreBackend("embedded", f"embedded://{server.address}", server.secret, server)
    else:
        cluster = request.getfixturevalue("etcd_server")
        # A fresh key space per test: wipe what earlier tests left.
        backend = StoreBackend("etcd", cluster.url, None, cluster)
        backend.open().delete_prefix("/")
    try:
        yield backend
    finally:
        backend.close_all()


@pytest.fixture(params=["embedded", "etcd"])
def store_args(request) -> list[str]:
    """``elastic-run`` arguments selecting each store: the driver's embedded one, or a
    real etcd server (a fresh job id per test keeps jobs apart)."""
    if request.param == "embedded":
        return []
    cluster = request.getfixturevalue("etcd_server")
    import uuid

    return ["--rendezvous", cluster.url, "--job-id", f"t{uuid.uuid4().hex[:10]}"]


@pytest.fixture
def three_hosts(tmp_path):
    """Three separate test hosts (network, UTS, PID and mount namespaces, own sshd):
    see ``tests/netns_hosts.py``."""
    from tests.netns_hosts import running_hosts

    with running_hosts(3, tmp_path / "hosts") as hosts:
        yield hosts
