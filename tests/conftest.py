"""Shared fixtures: real etcd servers, the embedded store server, and both backends;
the test kinds.

The tree mirrors the code, package by package (``tests/driver/job`` tests
``driver/job``, ``tests/elastic/comm/peers`` tests ``elastic/comm/peers``, ...), with whole
jobs in ``tests/system`` (by concern: ``jobs``, ``faults``, ``hosts``, ``ps``) and
harnesses in ``tests/support`` (``comm``, ``ps``, ``hosts``: the test hosts and their
sshd). Every test is one
kind, by marker: ``unit`` (pure logic, no process, no socket: the module says so with
``pytestmark``), ``system`` (whole jobs: everything under ``tests/system``), and
``integration`` (the rest: real servers and processes). ``-m unit`` runs in seconds.

``store_backend`` parametrizes a test over both backends; it yields a ``StoreBackend``
whose ``open()`` makes clients of one fresh store.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from rendezvous import StoreSettings, open_store
from rendezvous.backends.embedded import EmbeddedServer
from rendezvous.net.auth import make_secret
from tests.support.etcd_cluster import EtcdCluster

# Property tests check logic, not speed: hypothesis's 200 ms deadline per example fails
# them on a loaded 2-core CI machine for a slow example, and flaky is broken.
hypothesis_settings.register_profile("elastic", deadline=None)
hypothesis_settings.load_profile("elastic")

# Fixtures that live in their own modules (the real sshd, the comm workers).
pytest_plugins = ["tests.support.hosts.sshd", "tests.support.comm.harness"]

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


class SecretKeepingServer(EmbeddedServer):
    """The store server with its secret at hand, for the tests' clients."""

    def __init__(self, secret: str):
        super().__init__(secret)
        self.secret = secret


@pytest.fixture
def embedded_server():
    server = SecretKeepingServer(make_secret())
    server.start()
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
def store_backend(request, tmp_path) -> Iterator[StoreBackend]:
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
    see ``tests/support/hosts/netns.py``."""
    from tests.support.hosts.netns import running_hosts

    with running_hosts(3, tmp_path / "hosts") as hosts:
        yield hosts


_SYSTEM = Path(__file__).resolve().parent / "system"


def pytest_collection_modifyitems(items):
    """Give every test its kind (see the module docstring)."""
    for item in items:
        if item.get_closest_marker("unit"):
            continue
        if _SYSTEM in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.system)
        else:
            item.add_marker(pytest.mark.integration)
