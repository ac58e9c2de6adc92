"""The test hosts are separate enough to fool the code: own address, host name, process
ids and /dev/shm, their own sshd; a cut link drops packets silently; teardown is complete."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from tests.support.hosts.netns import NetnsHosts
from tests.support.jobs import wait_until


def test_hosts_are_separate_machines(three_hosts):
    a, b, c = three_hosts
    assert len({a.address, b.address, c.address}) == 3
    names = {h.run(["hostname"]).stdout.strip() for h in three_hosts}
    assert names == {a.name, b.name, c.name} and socket.gethostname() not in names
    # Their own process ids: PID 1 is the host's init, and ps sees only the host.
    assert "benchmarks.harness.netns_init" in a.run(["cat", "/proc/1/cmdline"]).stdout
    # A private /dev/shm: a segment made on one host is seen on no other, nor here.
    assert a.run(["sh", "-c", "echo x > /dev/shm/elastic-probe && ls /dev/shm"]).stdout.split() == [
        "elastic-probe"
    ]
    assert "elastic-probe" not in b.run(["ls", "/dev/shm"]).stdout
    assert not os.path.exists("/dev/shm/elastic-probe")
    # Their own address on the bridge, reached over ssh from here and from each other.
    out = subprocess.run(
        three_hosts.ssh_argv(b, f"hostname; ssh {three_hosts.ssh_options} {c.address} hostname"),
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert out.stdout.split() == [b.name, c.name], out.stderr


def _listen_on(host, port: int) -> subprocess.Popen:
    """A TCP server on ``host`` that accepts one connection and reads until EOF."""
    code = (
        "import socket,sys\n"
        f"s=socket.create_server(('{host.address}',{port}))\n"
        "print('listening',flush=True)\n"
        "c,_=s.accept()\n"
        "while c.recv(1024): pass\n"
    )
    proc = host.popen(["python3", "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "listening"
    return proc


def test_a_cut_link_drops_packets_without_fin_or_rst(three_hosts):
    a = three_hosts[0]
    server = _listen_on(a, 5555)
    try:
        conn = socket.create_connection((a.address, 5555), timeout=5)
        a.cut()
        # An established connection sees nothing: no FIN (recv would return b""), no RST.
        conn.settimeout(1.0)
        with pytest.raises(socket.timeout):
            conn.recv(1)
        # A new connection is not refused either: it times out.
        with pytest.raises(socket.timeout):
            socket.create_connection((a.address, 22), timeout=1.0)
        # The host's processes go on running.
        assert server.poll() is None
        a.restore()
        conn.sendall(b"still here")
        conn.close()
        assert server.wait(timeout=10) == 0
    finally:
        a.restore()
        server.kill()
        server.wait(timeout=10)


def test_teardown_leaves_nothing(tmp_path):
    hosts = NetnsHosts(2, tmp_path / "h").start()
    h = hosts[0]
    sleeper = h.popen(["sleep", "300"])
    wait_until(lambda: h.pids(), 10, "the sleeper on the host")
    assert h.init_pid is not None
    pids = h.pids() + [h.init_pid]
    netns = [x.netns for x in hosts]
    hosts.close()

    def running(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split()[2] != "Z"
        except OSError:
            return False

    wait_until(
        lambda: not any(running(p) for p in pids),
        10,
        "every process of the host to be gone",
    )
    assert sleeper.wait(timeout=10) is not None
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in netns)


def test_an_abandoned_network_is_reaped(tmp_path):
    """A session killed without teardown: the next one removes what it left."""
    code = (
        f"import sys,os; sys.path.insert(0, {str(os.getcwd())!r})\n"
        "from pathlib import Path\n"
        "from tests.support.hosts.netns import NetnsHosts\n"
        f"h = NetnsHosts(1, Path({str(tmp_path / 'x')!r})).start()\n"
        "print(h[0].netns, h[0].init_pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    out = subprocess.run(
        ["python3", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    netns, init_pid = out.stdout.split()
    assert netns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    with NetnsHosts(1, tmp_path / "y") as fresh:
        # The abandoned network was removed (its name may be claimed afresh).
        assert fresh[0].init_pid != int(init_pid)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{init_pid}") and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the abandoned init's exit with a deadline
        assert not os.path.exists(f"/proc/{init_pid}")
