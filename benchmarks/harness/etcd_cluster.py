"""Real etcd servers on free loopback ports, for tests and benchmarks.

``EtcdCluster(n, workdir)`` starts ``n`` members (temp data dirs, never port 2379),
can SIGKILL and restart any member on its own data dir, and reaps everything on
``stop()``. With ``hosts`` (``benchmarks.harness.netns`` hosts, one per member), member ``i``
runs on host ``i`` at its own address, ports 2379/2380, as on separate machines. Raises RuntimeError (with the tail of the member's log) when a member
does not become healthy within the deadline.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_open(address: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((address, port)) == 0


class EtcdCluster:
    def __init__(
        self,
        size: int,
        workdir: Path,
        ready_timeout: float = 30.0,
        tls: dict | None = None,
        hosts: list | None = None,
        timing_ms: tuple[int, int] = (50, 500),
    ):
        """``tls``: {"cert", "key", "ca"} file paths: clients must then speak TLS and show a
        certificate signed by ``ca`` (the client side reads ELASTIC_ETCD_* from the env;
        the cluster's own readiness check uses "client_cert" and "client_key" when the
        dict has them, as ``tests.support.pki.write_pki`` makes it).
        ``hosts``: one test host per member (``benchmarks.harness.netns.NetnsHost``)."""
        self.tls = tls
        self.timing_ms = timing_ms  # (heartbeat, election timeout): etcd's are (100, 1000)
        self.size = size
        self.workdir = Path(workdir)
        self.ready_timeout = ready_timeout
        self.hosts = hosts
        if hosts is not None:
            if len(hosts) != size:
                raise ValueError(f"{size} members need {size} hosts, got {len(hosts)}")
            self.addresses = [h.address for h in hosts]
            self.client_ports, self.peer_ports = [2379] * size, [2380] * size
        else:
            ports = free_ports(2 * size)
            self.addresses = ["127.0.0.1"] * size
            self.client_ports = ports[:size]
            self.peer_ports = ports[size:]
        self.names = [f"m{i}" for i in range(size)]
        self.procs: list[subprocess.Popen | None] = [None] * size
        self.initial_cluster = ",".join(
            f"{n}=http://{a}:{p}" for n, a, p in zip(self.names, self.addresses, self.peer_ports)
        )

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(f"{a}:{p}" for a, p in zip(self.addresses, self.client_ports))

    def member_url(self, i: int) -> str:
        return f"etcd://{self.addresses[i]}:{self.client_ports[i]}"

    def _command(self, i: int) -> list[str]:
        scheme = "https" if self.tls else "http"
        client = f"{scheme}://{self.addresses[i]}:{self.client_ports[i]}"
        peer = f"http://{self.addresses[i]}:{self.peer_ports[i]}"
        return [
            ETCD,
            "--name",
            self.names[i],
            "--data-dir",
            str(self.workdir / self.names[i]),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            self.initial_cluster,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            f"tok-{self.peer_ports[0]}",
            # Fast elections so failover tests stay short (this also makes etcd's shortest
            # lease 1.5 x the election timeout: 1 s instead of its default 2 s).
            "--heartbeat-interval",
            str(self.timing_ms[0]),
            "--election-timeout",
            str(self.timing_ms[1]),
            "--logger",
            "zap",
            "--log-level",
            "warn",
            *(
                [
                    "--cert-file",
                    self.tls["cert"],
                    "--key-file",
                    self.tls["key"],
                    "--trusted-ca-file",
                    self.tls["ca"],
                    "--client-cert-auth",
                ]
                if self.tls
                else []
            ),
        ]

    def start_member(self, i: int) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / f"{self.names[i]}.log", "ab") as log:
            if self.hosts is not None:
                self.procs[i] = self.hosts[i].popen(
                    self._command(i), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            else:
                self.procs[i] = subprocess.Popen(
                    self._command(i), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )

    def start(self) -> EtcdCluster:
        for i in range(self.size):
            self.start_member(i)
        try:
            for i in range(self.size):
                self.wait_ready(i)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, i: int) -> None:
        """Until member ``i`` answers a read (it has a leader)."""
        from rendezvous import StoreSettings
        from rendezvous.errors import RendezvousError

        deadline = time.monotonic() + self.ready_timeout
        settings = StoreSettings(request_timeout=1.0, retry_deadline=1.0, connect_timeout=1.0)
        while time.monotonic() < deadline:
            proc = self.procs[i]
            if proc is not None and proc.poll() is not None:
                break
            if _port_open(self.addresses[i], self.client_ports[i]):
                try:
                    self._client(i, settings).close()
                    return
                except RendezvousError:
                    pass
            time.sleep(0.05)  # polling a condition with a deadline
        raise RuntimeError(
            f"etcd member {i} not ready within {self.ready_timeout}s: {self.log_tail(i)}"
        )

    def _client(self, i: int, settings):
        """A client of member ``i`` that has answered a read: with the cluster's own
        client certificate when it has one (a test's environment may hold another, or
        none), else as the environment says.

        Raises:
            RendezvousError: it does not answer.
        """
        from rendezvous import open_store

        if not (self.tls and "client_cert" in self.tls):
            return open_store(self.member_url(i), settings=settings)
        from rendezvous.backends.etcd import EtcdCredentials, EtcdStore
        from rendezvous.net.url import Endpoint

        credentials = EtcdCredentials(
            ca_cert=self.tls["ca"], cert=self.tls["client_cert"], key=self.tls["client_key"]
        )
        store = EtcdStore(
            [Endpoint(self.addresses[i], self.client_ports[i])], settings, credentials
        )
        try:
            store.revision()
        except BaseException:
            store.close()
            raise
        return store

    def log_tail(self, i: int, lines: int = 10) -> str:
        try:
            return "\n".join(
                (self.workdir / f"{self.names[i]}.log").read_text().splitlines()[-lines:]
            )
        except OSError:
            return "(no log)"

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` and reap it (on a test host: the etcd under ``nsenter``)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            if self.hosts is not None:
                # The Popen is nsenter; etcd is its child in the host's namespaces.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        self.procs[i] = None

    def leader(self) -> int | None:
        """The index of the member that leads now (asked of the reachable members)."""
        import grpc
        from etcd3 import etcdrpc

        for i in range(self.size):
            if self.procs[i] is None or not _port_open(self.addresses[i], self.client_ports[i]):
                continue
            channel = grpc.insecure_channel(f"{self.addresses[i]}:{self.client_ports[i]}")
            try:
                status = etcdrpc.MaintenanceStub(channel).Status(etcdrpc.StatusRequest(), timeout=2)
            except grpc.RpcError:
                continue
            finally:
                channel.close()
            if status.leader == status.header.member_id:
                return i
        return None

    def enable_auth(self, password: str) -> None:
        """Create etcd's root user with ``password`` and turn authentication on (through
        etcd's own API, on member 0): every client must then log in."""
        import grpc
        from etcd3 import etcdrpc

        channel = grpc.insecure_channel(f"{self.addresses[0]}:{self.client_ports[0]}")
        try:
            auth = etcdrpc.AuthStub(channel)
            request = etcdrpc.AuthUserAddRequest(name="root", password=password)
            auth.UserAdd(request, timeout=5)
            grant = etcdrpc.AuthUserGrantRoleRequest(user="root", role="root")
            auth.UserGrantRole(grant, timeout=5)
            auth.AuthEnable(etcdrpc.AuthEnableRequest(), timeout=5)
        finally:
            channel.close()

    def restart(self, i: int, wait: bool = True) -> None:
        """Start member ``i`` again on its data dir."""
        self.kill(i)
        self.start_member(i)
        if wait:
            self.wait_ready(i)

    def stop(self) -> None:
        for i in range(self.size):
            self.kill(i)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
