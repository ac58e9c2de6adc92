"""Separate test hosts on one Linux machine, real enough to fool the code under test.

``NetnsHosts(count, workdir)`` makes ``count`` hosts. Each is:

* a network namespace with one interface (``eth0``, a veth) and its own address
  ``10.213.N.(10+i)/24`` on a bridge in the root namespace, which holds
  ``10.213.N.1`` (the test's own address on that network, where a driver started by the
  test itself is reached). ``N`` is claimed per ``NetnsHosts`` (the bridge's name is the
  lock), so concurrent test sessions do not collide;
* its own UTS namespace (host name ``h<i>-<N>``, which resolves nowhere: code that
  advertises a bare host name instead of an address fails, as it would across real
  machines), its own PID namespace (``/proc`` remounted: process ids are the host's),
  and its own mount namespace with a private tmpfs on ``/dev/shm`` (no shared-memory
  segment is visible from another host). The file system is otherwise shared, like a
  cluster's shared home directory: the same Python, the same checkout;
* its own real sshd on port 22 of its address, that ``ssh`` (and so
  ``elastic-run --launcher ssh``) reaches with the key in ``ssh_options``.

PID 1 of a host is ``benchmarks/harness/netns_init.py`` (an init that reaps orphans); killing it
makes the kernel SIGKILL every process of the host, so teardown is by pid and complete
even when a test fails half-way. ``cut()`` takes the host's link down on the bridge
side: its packets are dropped, nobody receives a FIN or an RST, its processes keep
running (a machine whose switch port died); ``restore()`` brings it back.

A ``NetnsHosts`` left behind by a killed test session is removed by the next one: the
owner's pid is recorded beside the bridge, and a dead owner's bridge, namespaces and
host processes are torn down on the next ``start()``.

Requires root (CI runs as root), iproute2 (``ip``), util-linux (``unshare``,
``nsenter``, ``mount``) and openssh-server; ``scripts/test`` installs them.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from benchmarks.harness.jobs import pid_alive, wait_until
from benchmarks.harness.paths import ROOT

SUBNET_PREFIX = "10.213"
STATE_DIR = Path("/run/elastic-test-hosts")
SSHD = "/usr/sbin/sshd"
READY_TIMEOUT = 20.0


class HostsError(RuntimeError):
    """A test host could not be made (missing tool, not root, a command that failed)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise HostsError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
    return out


def _ns_inode(pid: int, kind: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def _wait_for(predicate, timeout: float, what: str):
    """``wait_until``, a host's error (``HostsError``) when the time is up."""
    return wait_until(predicate, timeout, what, error=HostsError)


class NetnsHost:
    """One simulated machine; see the module docstring."""

    def __init__(self, net: int, index: int, workdir: Path):
        self.net = net
        self.index = index
        self.name = f"h{index}-{net}"
        self.address = f"{SUBNET_PREFIX}.{net}.{10 + index}"
        self.netns = f"eth{net}-{index}"
        self.veth = f"etv{net}h{index}"  # the bridge side: cut() takes it down
        self.workdir = workdir
        self.launcher: subprocess.Popen | None = None  # `unshare`, parent of the host's PID 1
        self.init_pid: int | None = None  # PID 1 of the host, seen from here
        self.log = workdir / f"{self.name}.log"

    def __repr__(self) -> str:
        return f"<NetnsHost {self.name} {self.address} init={self.init_pid}>"

    # -- making and breaking
    def create(self, bridge: str, sshd_config: Path) -> None:
        _ip("netns", "add", self.netns)
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        _ip("link", "set", self.veth, "master", bridge, "up")
        inside = ("netns", "exec", self.netns, "ip")
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "addr", "add", f"{self.address}/24", "dev", "eth0")
        _ip(*inside, "link", "set", "eth0", "up")
        _ip(*inside, "route", "add", "default", "via", f"{SUBNET_PREFIX}.{self.net}.1")
        with open(self.log, "ab") as log:
            self.launcher = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.netns,
                    "unshare",
                    "--uts",
                    "--mount",
                    "--pid",
                    "--fork",
                    "--propagation",
                    "private",
                    sys.executable,
                    "-m",
                    "benchmarks.harness.netns_init",
                    self.name,
                    str(sshd_config),
                ],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        ready = self.launcher.stdout.readline() if self.launcher.stdout else b""
        if ready.strip() != b"ready":
            raise HostsError(f"host {self.name} did not start: {self.log_tail()}")
        self.init_pid = _wait_for(
            lambda: next(iter(_children(self.launcher.pid)), None),
            5.0,
            f"PID 1 of host {self.name}",
        )

    def cut(self) -> None:
        """Drop every packet to and from this host from now on (no FIN, no RST)."""
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        _ip("link", "set", self.veth, "up")

    def destroy(self) -> None:
        """SIGKILL the host's PID 1 (and with it every process of the host), remove its
        namespace and link. Safe to call twice and after a partial ``create``."""
        if self.init_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
        if self.launcher is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.launcher.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.launcher.wait(timeout=10)
            if self.launcher.stdout:
                self.launcher.stdout.close()
            self.launcher = None
        _ip("link", "del", self.veth, check=False)
        _ip("netns", "del", self.netns, check=False)
        self.init_pid = None

    # -- running things on the host
    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespaces (network, UTS, PID, mount)."""
        if self.init_pid is None:
            raise HostsError(f"host {self.name} is not running")
        return ["nsenter", "-t", str(self.init_pid), "-n", "-u", "-p", "-m", "--", *argv]

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on this host (``kwargs`` go to ``Popen``). The returned process is
        ``nsenter``, which waits for ``argv`` and exits with its status; ``pids()`` lists
        the host's processes by their ids as seen from here."""
        kwargs.setdefault("cwd", ROOT)
        kwargs.setdefault("env", {**os.environ, "PYTHONPATH": str(ROOT)})
        return subprocess.Popen(self.command(argv), **kwargs)

    def process_of(self, proc: subprocess.Popen) -> int:
        """The id (as seen from here) of the program a ``popen()`` started: the child of
        its ``nsenter``, which is what a signal must reach."""
        return _wait_for(
            lambda: next(iter(_children(proc.pid)), None), 5.0, f"a process on host {self.name}"
        )

    def run(self, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(argv), capture_output=True, text=True, timeout=timeout, cwd=ROOT
        )

    def pids(self) -> list[int]:
        """Every process of this host but its init and sshd (ids as seen from here)."""
        if not self.init_pid:
            return []
        ns = _ns_inode(self.init_pid, "pid")
        if ns is None:
            return []
        keep = {self.init_pid, *_children(self.init_pid)[:1]}  # init and its first child, sshd
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in keep and _ns_inode(int(entry), "pid") == ns:
                found.append(int(entry))
        return sorted(found)

    def pid_here(self, host_pid: int) -> int:
        """The id as seen from here of the process this host knows as ``host_pid`` (an id
        the host's own programs report, such as a worker's pid in the driver's events).

        Raises:
            HostsError: no process of this host has that id.
        """
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/status") as f:
                    ids = next((ln.split()[1:] for ln in f if ln.startswith("NSpid:")), [])
            except OSError:
                continue
            if ids and int(ids[-1]) == host_pid:
                return pid
        raise HostsError(f"host {self.name} has no process {host_pid}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class NetnsHosts:
    """``count`` test hosts on one bridge; a context manager (``start``/``close``)."""

    def __init__(self, count: int, workdir: Path):
        if count < 1:
            raise ValueError("count must be at least 1")
        self.count = count
        self.workdir = Path(workdir)
        self.net: int | None = None
        self.bridge = ""
        self.hosts: list[NetnsHost] = []
        self.key = self.workdir / "id_ed25519"
        self.host_key = self.workdir / "ssh_host_ed25519_key"

    # -- addresses and ssh
    @property
    def gateway(self) -> str:
        """The test's own address on the hosts' network (the root namespace)."""
        return f"{SUBNET_PREFIX}.{self.net}.1"

    @property
    def ssh_options(self) -> str:
        """ssh arguments that log in to every host as this user (``ELASTIC_SSH_OPTIONS``)."""
        return shlex.join(
            [
                "-F",
                "/dev/null",
                "-i",
                str(self.key),
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
            ]
        )

    def ssh_argv(self, host: NetnsHost, command: str) -> list[str]:
        return ["ssh", *shlex.split(self.ssh_options), host.address, command]

    def env(self) -> dict[str, str]:
        """Environment for an ``elastic-run`` that reaches the hosts over ssh."""
        return {**os.environ, "PYTHONPATH": str(ROOT), "ELASTIC_SSH_OPTIONS": self.ssh_options}

    def quick_resolver(self) -> None:
        """Make name lookups on the hosts fail at once, as on a cluster whose DNS answers.

        The hosts' network reaches no name server, so every lookup would wait out the
        resolver's timeouts (10 s); torch's TCPStore client does a reverse lookup of its
        peer on every connect, so torch's workers would time out connecting to their own
        store. Each host gets (in its own mount namespace) a resolv.conf naming a server
        on its loopback, where nothing listens: the query is refused, the lookup fails at
        once.

        Raises:
            HostsError: the bind mount failed.
        """
        conf = self.workdir / "resolv.conf"
        conf.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        for host in self.hosts:
            done = host.run(["mount", "--bind", str(conf), "/etc/resolv.conf"])
            if done.returncode != 0:
                raise HostsError(
                    f"cannot give host {host.name} a resolv.conf: {done.stderr.strip()}"
                )

    # -- life
    def start(self) -> NetnsHosts:
        for tool in ("ip", "unshare", "nsenter", "ssh", "ssh-keygen"):
            if shutil.which(tool) is None:
                raise HostsError(
                    f"{tool} not found: install iproute2, util-linux and "
                    "openssh (scripts/test does)"
                )
        if not os.access(SSHD, os.X_OK):
            raise HostsError(f"{SSHD} not found: install openssh-server (scripts/test does)")
        if os.geteuid() != 0:
            raise HostsError("test hosts need root (network and PID namespaces)")
        reap_abandoned()
        self.workdir.mkdir(parents=True, exist_ok=True)
        net = self._claim_network()
        try:
            self._make_keys()
            for index in range(1, self.count + 1):
                host = NetnsHost(net, index, self.workdir)
                self.hosts.append(host)
                host.create(self.bridge, self._sshd_config(host))
            for host in self.hosts:
                self._wait_ssh(host)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for host in self.hosts:
            host.destroy()
        self.hosts = []
        if self.bridge:
            _ip("link", "del", self.bridge, check=False)
            with contextlib.suppress(OSError):
                (STATE_DIR / self.bridge).unlink()
            self.bridge = ""

    def __enter__(self) -> NetnsHosts:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __getitem__(self, index: int) -> NetnsHost:
        return self.hosts[index]

    def __iter__(self):
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    # -- internals
    def _claim_network(self) -> int:
        """Take the first free test network (its bridge); its number."""
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        for net in range(1, 251):
            bridge = f"etb{net}"
            if _ip("link", "add", bridge, "type", "bridge", check=False).returncode == 0:
                self.net, self.bridge = net, bridge
                (STATE_DIR / bridge).write_text(f"{os.getpid()}\n")
                _ip("addr", "add", f"{self.gateway}/24", "dev", bridge)
                _ip("link", "set", bridge, "up")
                return net
        raise HostsError("no free test network 10.213.1-250.0/24")

    def _make_keys(self) -> None:
        for path in (self.key, self.host_key):
            for old in (path, path.with_name(path.name + ".pub")):
                old.unlink(missing_ok=True)
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                check=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
            )
        shutil.copyfile(f"{self.key}.pub", self.workdir / "authorized_keys")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)

    def _sshd_config(self, host: NetnsHost) -> Path:
        path = self.workdir / f"sshd_config.{host.name}"
        path.write_text(
            "\n".join(
                [
                    f"ListenAddress {host.address}:22",
                    f"HostKey {self.host_key}",
                    f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
                    "PidFile none",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",  # tmp dirs are world-writable
                    "MaxStartups 200",
                    "MaxSessions 200",
                    "PrintMotd no",
                    "LogLevel ERROR",
                ]
            )
            + "\n"
        )
        return path

    def _wait_ssh(self, host: NetnsHost) -> None:
        def logged_in() -> bool:
            done = subprocess.run(
                self.ssh_argv(host, "true"),
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=10,
            )
            return done.returncode == 0

        _wait_for(logged_in, READY_TIMEOUT, f"sshd of host {host.name} to accept a login")


def reap_abandoned() -> None:
    """Tear down test networks whose owning process is gone (a killed test session)."""
    if not STATE_DIR.is_dir():
        return
    for record in STATE_DIR.iterdir():
        try:
            owner = int(record.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            owner = 0
        if owner and pid_alive(owner):
            continue
        net = int(record.name[3:]) if record.name[3:].isdigit() else None
        if net is None:
            continue
        for index in range(1, 65):
            netns = f"eth{net}-{index}"
            if not Path(f"/run/netns/{netns}").exists():
                continue
            # Every process in that network namespace: the abandoned host's init first.
            ns = os.stat(f"/run/netns/{netns}").st_ino
            for entry in os.listdir("/proc"):
                if entry.isdigit() and _ns_inode(int(entry), "net") == ns:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(entry), signal.SIGKILL)
            _ip("link", "del", f"etv{net}h{index}", check=False)
            _ip("netns", "del", netns, check=False)
        _ip("link", "del", record.name, check=False)
        with contextlib.suppress(OSError):
            record.unlink()


@contextlib.contextmanager
def running_hosts(count: int, workdir: Path):
    """``NetnsHosts`` as a context manager that also tears down at interpreter exit (a
    test interrupted by its timeout still leaves nothing behind)."""
    import atexit

    hosts = NetnsHosts(count, workdir)
    atexit.register(hosts.close)
    try:
        yield hosts.start()
    finally:
        hosts.close()
        atexit.unregister(hosts.close)
