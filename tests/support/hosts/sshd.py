"""A real OpenSSH server on a free loopback port, for tests of the ssh launcher.

``SSHServer(workdir).start()`` generates a host key and a fresh client key with
``ssh-keygen`` in ``workdir``, writes a private ``sshd_config`` (key-only login for
the current user, no PAM, ``StrictModes no`` because tmp dirs are world-writable,
``AuthorizedKeysFile`` pointing at the fresh client key) and runs
``/usr/sbin/sshd -D -e -f CONFIG`` in the foreground, so the fixture owns the process
and reaps it on ``stop()``. ``server.settings()`` is an ``SSHSettings`` with the
port and identity that log in to it (and a known-hosts file inside ``workdir``, so
tests never touch ``~/.ssh``).

As root (CI), sshd needs its privilege-separation directory ``/run/sshd``: it is
created if missing. As another user sshd still runs, and lets in only that user.

Use from a test module::

    from tests.support.hosts.sshd import sshd_server  # noqa: F401  (a pytest fixture)

    def test_x(sshd_server):
        launcher = get_launcher("ssh", ssh_settings=sshd_server.settings())
        proc = launcher.launch(LaunchSpec(host="127.0.0.1", ...))

Raises ``SSHServerError`` (with the tail of sshd's log) when sshd or ssh-keygen is
missing, the config is refused, or the server does not accept a login in time.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from driver.launch.spec import SSHSettings

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
SSH = shutil.which("ssh") or "/usr/bin/ssh"
PRIVSEP_DIR = Path("/run/sshd")


class SSHServerError(RuntimeError):
    """The test sshd could not be set up or did not become ready."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    # ssh-keygen asks before overwriting (and fails without a tty): start fresh.
    for old in (path, path.with_name(path.name + ".pub")):
        old.unlink(missing_ok=True)
    try:
        done = subprocess.run(
            [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "elastic-test", "-f", str(path)],
            timeout=30,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise SSHServerError(f"ssh-keygen for {path} failed: {e}") from e
    if done.returncode != 0:
        raise SSHServerError(
            f"ssh-keygen for {path} exited {done.returncode}: "
            f"{done.stderr.decode(errors='replace').strip()}"
        )


class SSHServer:
    """One sshd on ``127.0.0.1:<port>`` that accepts ``client_key`` for the current user."""

    def __init__(self, workdir: Path, ready_timeout: float = 20.0):
        self.workdir = Path(workdir)
        self.ready_timeout = ready_timeout
        self.port = free_port()
        self.user = getpass.getuser()
        self.host_key = self.workdir / "ssh_host_ed25519_key"
        self.client_key = self.workdir / "id_ed25519"
        self.authorized_keys = self.workdir / "authorized_keys"
        self.known_hosts = self.workdir / "known_hosts"
        self.config = self.workdir / "sshd_config"
        self.log = self.workdir / "sshd.log"
        self.proc: subprocess.Popen | None = None

    def settings(self, **overrides) -> SSHSettings:
        """Client settings that log in to this server (fields can be overridden)."""
        values: dict[str, Any] = dict(
            port=self.port,
            identity_file=str(self.client_key),
            user=self.user,
            connect_timeout=10.0,
            extra_options=("-F", "/dev/null", "-o", f"UserKnownHostsFile={self.known_hosts}"),
        )
        values.update(overrides)
        return SSHSettings(**values)

    def _write_config(self) -> None:
        lines = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.host_key}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            f"PidFile {self.workdir / 'sshd.pid'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # tmp dirs are world-writable: StrictModes would refuse the key files.
            "StrictModes no",
            # Tests open many sessions at once; the default 10:30:100 drops some.
            "MaxStartups 200",
            "MaxSessions 200",
            "PrintMotd no",
            "LogLevel ERROR",
        ]
        self.config.write_text("\n".join(lines) + "\n")

    def start(self) -> SSHServer:
        if not os.access(SSHD, os.X_OK):
            raise SSHServerError(f"{SSHD} not found: install openssh-server (scripts/test does)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        _keygen(self.host_key)
        _keygen(self.client_key)
        shutil.copyfile(f"{self.client_key}.pub", self.authorized_keys)
        os.chmod(self.client_key, 0o600)
        self._write_config()
        if os.geteuid() == 0:
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            # -D: stay in the foreground (we own and reap it); -e: log to stderr (our file).
            self.proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        try:
            self._wait_ready(self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, proc: subprocess.Popen) -> None:
        """Until a real login runs ``true`` (the port being open is not enough), while
        sshd ``proc`` lives."""
        deadline = time.monotonic() + self.ready_timeout
        argv = [
            SSH,
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=5",
            "-i",
            str(self.client_key),
            "-p",
            str(self.port),
            "-l",
            self.user,
            "127.0.0.1",
            "true",
        ]
        last = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SSHServerError(f"sshd exited with {proc.returncode}: {self.log_tail()}")
            try:
                done = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=max(1.0, deadline - time.monotonic()),
                )
                if done.returncode == 0:
                    return
                last = done.stderr.decode(errors="replace").strip()
            except subprocess.TimeoutExpired:
                last = "login timed out"
            time.sleep(0.05)  # polling a condition with a deadline
        raise SSHServerError(
            f"sshd on port {self.port} not ready within {self.ready_timeout}s "
            f"(last ssh error: {last}): {self.log_tail()}"
        )

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop sshd and every session it still runs (its process group), then reap it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            # Sessions run in their own sessions (sshd setsid()s them); the launcher tests
            # reap theirs. SIGTERM lets sshd close its listener; SIGKILL if it lingers.
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def __enter__(self) -> SSHServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@pytest.fixture(scope="module")
def sshd_server(tmp_path_factory):
    """A real sshd for the test module; yields the ``SSHServer`` (use ``.settings()``)."""
    with SSHServer(tmp_path_factory.mktemp("sshd")) as server:
        yield server
