"""The launchers with real processes, real signals and a real sshd on loopback.

Pure-logic tests (spec validation, ssh argv, env selection and encoding) come first;
then the local launcher, the remote wrapper run by /bin/sh directly, and the ssh
launcher through ``tests.support.hosts.sshd``. Every launched process is stopped and reaped
by the ``procs`` fixture, even when a test fails.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from driver.config import parse_args
from driver.errors import LaunchError, LaunchSpecError, UnknownLauncherError
from driver.launch import registry
from driver.launch.auto import AutoLauncher
from driver.launch.local import LocalLauncher
from driver.launch.registry import get_launcher
from driver.launch.spec import LaunchSpec, SSHSettings
from driver.launch.ssh import SSHLauncher
from driver.launch.ssh_wrapper import (
    CONTROL_KILL,
    CONTROL_TERM,
    NOT_FORWARDED,
    encode_env_block,
    remote_environment,
    remote_script,
    ssh_argv,
    ssh_remote_command,
)
from rendezvous.errors import ElasticError
from tests.support.hosts.sshd import free_port
from tests.support.jobs import wait_until

PY = sys.executable


# ----------------------------------------------------------------------------- helpers


wait_for = wait_until  # one polling helper for every test


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie awaiting its reaper counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


class Captured:
    """Binary stand-ins for the driver's stdout and stderr."""

    def __init__(self):
        self.out = io.BytesIO()
        self.err = io.BytesIO()

    def stdout(self) -> str:
        return self.out.getvalue().decode("utf-8", "replace")

    def stderr(self) -> str:
        return self.err.getvalue().decode("utf-8", "replace")

    def value_after(self, marker: str, timeout: float = 10.0) -> str:
        """The word after ``marker`` in stdout, once it has been printed."""

        def find():
            text = self.stdout()
            if marker in text:
                rest = text.split(marker, 1)[1]
                if "\n" in rest:
                    return rest.split("\n", 1)[0].strip()
            return None

        return wait_for(find, timeout, f"{marker!r} in the output")


@pytest.fixture
def cap():
    return Captured()


@pytest.fixture
def procs():
    """Collects WorkerProcesses and raw Popens; stops and reaps all of them at the end."""
    started: list[Any] = []
    yield started
    for p in started:
        if isinstance(p, subprocess.Popen):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
            for pipe in (p.stdin, p.stdout, p.stderr):
                if pipe is not None:
                    pipe.close()
        else:
            p.stop(grace=0.2)


def spec(*command: str, host: str = "localhost", slot: int = 0, **kw) -> LaunchSpec:
    return LaunchSpec(host=host, slot=slot, command=command, **kw)


# ----------------------------------------------------------------------------- pure logic


def test_launch_spec_normalizes_and_validates():
    env = {"A": "1"}
    s = LaunchSpec(host="h", slot=2, command=["python", "x.py"], env=env, cwd="/tmp")
    env["B"] = "2"
    assert s.command == ("python", "x.py") and s.env == {"A": "1"}
    assert s.label == "h:2"
    assert LaunchSpec(host="h", slot=0, command=("x",), label="ps0").label == "ps0"
    with pytest.raises(AttributeError):
        s.host = "other"  # type: ignore[misc]  # frozen: the assignment must fail
    for bad in (
        dict(command=()),
        dict(command="python x.py"),
        dict(command=("a", 1)),
        dict(command=("a\0",)),
        dict(slot=-1),
        dict(host=""),
        dict(env={"1BAD": "x"}),
        dict(env={"A-B": "x"}),
        dict(env={"A": "x\0y"}),
        dict(env={"A": 3}),
    ):
        args: dict[str, Any] = dict(host="h", slot=0, command=("x",))
        args.update(bad)
        with pytest.raises(LaunchSpecError):
            LaunchSpec(**args)
    assert issubclass(LaunchSpecError, ElasticError) and issubclass(LaunchSpecError, ValueError)


def test_ssh_settings_validation():
    SSHSettings(port=22, remote_grace=0.5)
    for bad in (
        dict(port=0),
        dict(port=70000),
        dict(port="22"),
        dict(remote_grace=0),
        dict(connect_timeout=-1),
        dict(server_alive_count=0),
    ):
        with pytest.raises(LaunchSpecError):
            SSHSettings(**bad)
    assert SSHSettings(extra_options=["-v"]).extra_options == ("-v",)


def test_ssh_argv_options_order_and_host_checks():
    s = SSHSettings(
        port=2222, identity_file="/k/id", user="alice", extra_options=("-o", "ConnectTimeout=99")
    )
    argv = ssh_argv("node-1", "REMOTE", s)
    assert argv[0] == "ssh" and argv[-3:] == ["--", "node-1", "REMOTE"]
    joined = " ".join(argv)
    for expected in (
        "-o BatchMode=yes",
        "-o StrictHostKeyChecking=no",
        "-p 2222",
        "-i /k/id",
        "-o IdentitiesOnly=yes",
        "-l alice",
        "-T",
    ):
        assert expected in joined
    # ssh keeps the first value of an option: the user's extra options come first.
    assert joined.index("ConnectTimeout=99") < joined.index("ConnectTimeout=10")
    plain = ssh_argv("h", "R", SSHSettings())
    assert "-p" not in plain and "-i" not in plain and "-l" not in plain
    for host in ("", "-oProxyCommand=evil", "a b", "h\n"):
        with pytest.raises(LaunchSpecError):
            ssh_argv(host, "R", SSHSettings())


def test_remote_environment_selection():
    driver = {
        "PATH": "/opt/bin:/usr/bin",
        "PYTHONPATH": "/src",
        "VIRTUAL_ENV": "/venv",
        "ELASTIC_X": "1",
        "MY_FLAG": "on",
        "HOME": "/root",
        "SSH_AUTH_SOCK": "/s",
        "XDG_RUNTIME_DIR": "/run/u",
        "TMPDIR": "/tmp/x",
        "BASH_FUNC_f%%": "() { :; }",
        "SECRET_TOKEN": "t",
        "OLDPWD": "/",
    }
    env = remote_environment(
        {"ELASTIC_X": "2", "JOB": "j"}, driver, SSHSettings(env_exclude=("SECRET_*",))
    )
    assert env == {
        "PATH": "/opt/bin:/usr/bin",
        "PYTHONPATH": "/src",
        "VIRTUAL_ENV": "/venv",
        "ELASTIC_X": "2",
        "MY_FLAG": "on",
        "JOB": "j",
    }
    assert remote_environment({"JOB": "j"}, driver, SSHSettings(forward_env=False)) == {"JOB": "j"}
    assert "HOME" in NOT_FORWARDED and "SSH_*" in NOT_FORWARDED


def test_encode_env_block():
    block = encode_env_block({"A": "plain value", "B": "two\nlines", "C": "back\\slash", "D": ""})
    assert block == (b"A=plain value\n:B=two\\nlines\n:C=back\\\\slash\nD=\n\n")
    assert encode_env_block({}) == b"\n"
    with pytest.raises(LaunchSpecError):
        encode_env_block({"A B": "x"})


def test_remote_script_is_one_line_without_shell_hazards():
    script = remote_script(
        ("python3", "train.py", "--lr", "0.1; rm -rf /", "it's"), "/data/my dir", remote_grace=2.5
    )
    # csh and fish parse the outer quoting: no newline, backslash or history "!".
    assert "\n" not in script and "\\" not in script and "!" not in script
    assert shlex.quote("/data/my dir") in script
    assert shlex.join(("python3", "train.py", "--lr", "0.1; rm -rf /", "it's")) in script
    assert "-lt 3 ]" in script  # grace rounded up to whole seconds
    # It parses as sh (dash) and as the remote command ssh sends (through bash).
    subprocess.run(["/bin/sh", "-n", "-c", script], check=True, timeout=10)
    remote = ssh_remote_command(spec("a", "b"), "/tmp", SSHSettings())
    assert remote.startswith("exec /bin/sh -c ")
    subprocess.run(["bash", "-n", "-c", remote], check=True, timeout=10)


def test_get_launcher_by_name():
    assert isinstance(get_launcher("local"), LocalLauncher)
    ssh = get_launcher("ssh", ssh_settings=SSHSettings(port=2222))
    assert isinstance(ssh, SSHLauncher) and ssh.settings.port == 2222
    assert isinstance(get_launcher("auto", is_local=lambda h: True), AutoLauncher)
    with pytest.raises(UnknownLauncherError, match="unknown launcher 'mpi'"):
        get_launcher("mpi")


def test_a_launcher_registered_by_name_is_offered_by_the_flags(monkeypatch):
    """The seam a new launcher plugs into: a creator under a name in ``LAUNCHERS``,
    and ``--launcher`` offers it with no other change."""

    class Recorder(LocalLauncher):
        name = "recorder"

    monkeypatch.setitem(registry.LAUNCHERS, "recorder", lambda options: Recorder(options.out))
    assert registry.launcher_names() == ("auto", "local", "ssh", "slurm", "ray", "recorder")
    assert isinstance(get_launcher("recorder"), Recorder)
    assert parse_args(["-np", "1", "--launcher", "recorder", "true"]).launcher == "recorder"


# ----------------------------------------------------------------------------- local


def test_local_launch_env_cwd_output_and_exit_code(tmp_path, cap, procs, monkeypatch):
    monkeypatch.setenv("FROM_DRIVER", "inherited")
    code = (
        "import os, sys; print(os.environ['JOB_VAR']); print(os.environ['FROM_DRIVER']);"
        "print(os.getcwd()); print('to stderr', file=sys.stderr); sys.exit(3)"
    )
    p = LocalLauncher(cap.out, cap.err).launch(
        spec(PY, "-c", code, env={"JOB_VAR": "job value"}, cwd=str(tmp_path))
    )
    procs.append(p)
    assert p.wait(20) == 3 and p.returncode == 3
    assert p.join_output(5)
    assert cap.stdout().splitlines() == [
        "[localhost:0] job value",
        "[localhost:0] inherited",
        f"[localhost:0] {tmp_path}",
    ]
    assert cap.stderr() == "[localhost:0] to stderr\n"


def test_local_prefix_follows_rank(cap, procs):
    code = (
        "import itertools, time\n"
        "for i in itertools.count():\n"
        "    print('line', i, flush=True); time.sleep(0.01)\n"
    )
    p = LocalLauncher(cap.out, cap.err).launch(spec(PY, "-c", code, host="n1", slot=3))
    procs.append(p)
    wait_for(lambda: "line" in cap.stdout(), 20, "the first line")
    assert p.wait(0.05) is None and p.poll() is None  # still running: no exit code yet
    p.rank = 5  # a round gave it a rank: the following lines say so
    wait_for(lambda: "[5] line" in cap.stdout(), 10, "a line with the rank prefix")
    assert p.stop(grace=5) == -signal.SIGTERM
    lines = cap.stdout().splitlines()
    assert lines[0] == "[n1:3] line 0"
    first_ranked = next(i for i, line in enumerate(lines) if line.startswith("[5]"))
    assert all(line.startswith("[n1:3] line ") for line in lines[:first_ranked])
    assert all(line.startswith("[5] line ") for line in lines[first_ranked:])


def test_local_stop_escalates_to_sigkill_for_the_whole_group(cap, procs):
    # Leader and child both ignore SIGTERM: only the group SIGKILL ends them.
    code = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    while True: time.sleep(0.05)\n"
        "print('pids', os.getpid(), child, flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    p = LocalLauncher(cap.out, cap.err).launch(spec(PY, "-c", code))
    procs.append(p)
    leader, child = map(int, cap.value_after("pids").split())
    assert leader == p.pid
    started = time.monotonic()
    rc = p.stop(grace=0.5)
    took = time.monotonic() - started
    assert rc == -signal.SIGKILL
    assert 0.5 <= took < 3.0
    wait_for(lambda: not alive(child), 5, "the child to die with its group")


def test_local_sigkill_from_outside_is_the_return_code(cap, procs):
    p = LocalLauncher(cap.out, cap.err).launch(spec(PY, "-c", "import time; time.sleep(60)"))
    procs.append(p)
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(10) == -signal.SIGKILL
    assert p.stop(grace=0.1) == -signal.SIGKILL  # stopping an exited worker is harmless


def test_local_exit_kills_strays_left_in_the_group(cap, procs):
    # The stray holds the stdout pipe: without the cleanup the pump would never end.
    p = LocalLauncher(cap.out, cap.err).launch(
        spec("/bin/sh", "-c", "sleep 100 & echo stray $!; exit 4")
    )
    procs.append(p)
    stray = int(cap.value_after("stray"))
    assert p.wait(10) == 4
    wait_for(lambda: not alive(stray), 5, "the stray to be killed")
    assert p.join_output(5)


def test_local_output_log_file(tmp_path, cap, procs):
    log = tmp_path / "w0.log"
    p = LocalLauncher(cap.out, cap.err).launch(
        spec(PY, "-c", "import sys; print('out'); print('err', file=sys.stderr)", log_path=str(log))
    )
    procs.append(p)
    assert p.wait(20) == 0 and p.join_output(5)
    assert sorted(log.read_text().splitlines()) == ["err", "out"]
    with pytest.raises(LaunchError, match="output log"):
        LocalLauncher(cap.out, cap.err).launch(
            spec(PY, "-c", "pass", log_path=str(tmp_path / "no-dir" / "w.log"))
        )


def test_local_launch_errors(tmp_path):
    launcher = LocalLauncher(io.BytesIO(), io.BytesIO())
    with pytest.raises(LaunchError, match="no-such-command"):
        launcher.launch(spec("no-such-command-xyz"))
    with pytest.raises(LaunchError, match="missing"):
        launcher.launch(spec(PY, "-c", "pass", cwd=str(tmp_path / "missing")))


def test_auto_launcher_runs_local_hosts_locally(cap, procs):
    seen = []

    def is_local(host: str) -> bool:
        seen.append(host)
        return True

    auto = AutoLauncher(SSHSettings(port=free_port()), cap.out, cap.err, is_local=is_local)
    p = auto.launch(spec(PY, "-c", "print('here')", host="pretend-host"))
    procs.append(p)
    assert p.wait(20) == 0 and seen == ["pretend-host"]
    assert p.join_output(5) and cap.stdout() == "[pretend-host:0] here\n"


# ----------------------------------------------------------------------------- the wrapper


def run_wrapper(procs, command, env_block: bytes, cwd="/", grace=1.0):
    """The remote wrapper under /bin/sh, as sshd would run it (own session, stdin pipe)."""
    p = subprocess.Popen(
        ["/bin/sh", "-c", remote_script(command, cwd, grace)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    procs.append(p)
    assert p.stdin is not None  # stdin=PIPE
    p.stdin.write(env_block)
    p.stdin.flush()
    return p


def read_line(p: subprocess.Popen) -> str:
    assert p.stdout is not None  # run_wrapper's stdout=PIPE
    return p.stdout.readline().decode().strip()


def test_wrapper_decodes_env_and_reports_exit_code(procs):
    env = {"A": "x y 'z' $HOME `id`", "B": "multi\nline\\n", "C": ""}
    p = run_wrapper(
        procs,
        ("sh", "-c", 'printf "%s|" "$A" "$B" "$C"; pwd; exit 9'),
        encode_env_block(env),
        cwd="/tmp",
    )
    # stdin stays open: its end would mean "connection lost" and stop the worker.
    assert p.wait(timeout=10) == 9
    assert p.stdout.read().decode() == "x y 'z' $HOME `id`|multi\nline\\n||/tmp\n"


def test_wrapper_term_line_stops_worker_and_keeps_its_status(procs):
    p = run_wrapper(procs, ("sh", "-c", "echo up; exec sleep 60"), encode_env_block({}))
    assert read_line(p) == "up"
    p.stdin.write(f"{CONTROL_TERM}\n".encode())
    p.stdin.flush()
    assert p.wait(timeout=10) == 128 + signal.SIGTERM


def test_wrapper_kill_line_kills_a_worker_that_ignores_term(procs):
    p = run_wrapper(
        procs,
        ("sh", "-c", "trap '' TERM; echo $$; while :; do sleep 0.05; done"),
        encode_env_block({}),
    )
    worker = int(read_line(p))
    p.stdin.write(f"{CONTROL_TERM}\n{CONTROL_KILL}\n".encode())
    p.stdin.flush()
    p.wait(timeout=10)
    wait_for(lambda: not alive(worker), 5, "the worker to be killed")


def test_wrapper_eof_terms_then_kills_after_grace(procs):
    p = run_wrapper(
        procs,
        ("sh", "-c", "trap '' TERM; echo $$; while :; do sleep 0.05; done"),
        encode_env_block({}),
        grace=1.0,
    )
    worker = int(read_line(p))
    started = time.monotonic()
    p.stdin.close()  # what the remote side sees when the connection is gone
    p.wait(timeout=10)
    wait_for(lambda: not alive(worker), 5, "the worker to be killed")
    assert time.monotonic() - started >= 0.9  # SIGTERM was ignored: SIGKILL after the grace


def test_wrapper_refuses_to_run_without_the_whole_environment(procs):
    p = run_wrapper(procs, ("sh", "-c", "echo ran"), b"A=1\n")  # no terminating empty line
    p.stdin.close()
    assert p.wait(timeout=10) == 125
    assert p.stdout.read() == b""


# ----------------------------------------------------------------------------- ssh


@pytest.fixture
def ssh_launcher(sshd_server, cap):
    return SSHLauncher(sshd_server.settings(remote_grace=1.0), cap.out, cap.err)


def test_ssh_carries_env_cwd_and_exit_code(ssh_launcher, cap, procs, tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_TEST_FORWARDED", "from the driver")
    monkeypatch.setenv("XDG_TEST_NOT_FORWARDED", "no")
    secret = "s3cr3t-" + os.urandom(8).hex()
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    script = (
        'printf "%s|" "$JOB_VAR" "$ELASTIC_JOB_SECRET" "$ELASTIC_TEST_FORWARDED" '
        '"${XDG_TEST_NOT_FORWARDED-unset}"; echo; pwd; '
        # The wrapper (our parent) must not carry the secret on its command line.
        'tr "\\0" " " < /proc/$PPID/cmdline; echo; echo oops >&2; exit 7'
    )
    env = {"JOB_VAR": 'it\'s "quoted" $x\nand two lines', "ELASTIC_JOB_SECRET": secret}
    p = ssh_launcher.launch(
        spec("sh", "-c", script, host="127.0.0.1", slot=1, env=env, cwd=str(workdir))
    )
    procs.append(p)
    assert p.wait(20) == 7
    assert p.join_output(5)
    lines = cap.stdout().splitlines()
    assert lines[0] == '[127.0.0.1:1] it\'s "quoted" $x'
    assert lines[1] == f"[127.0.0.1:1] and two lines|{secret}|from the driver|unset|"
    assert lines[2] == f"[127.0.0.1:1] {workdir}"
    assert "/bin/sh" in lines[3] and secret not in lines[3]
    assert cap.stderr() == "[127.0.0.1:1] oops\n"


def test_ssh_terminate_returns_the_workers_status(ssh_launcher, cap, procs):
    p = ssh_launcher.launch(spec("sh", "-c", "echo pid $$; exec sleep 60", host="127.0.0.1"))
    procs.append(p)
    remote = int(cap.value_after("pid"))
    p.terminate()
    assert p.wait(10) == 128 + signal.SIGTERM
    wait_for(lambda: not alive(remote), 5, "the remote worker to exit")


def test_ssh_stop_kills_a_remote_worker_that_ignores_term(ssh_launcher, cap, procs):
    script = "trap '' TERM; echo pid $$; while :; do sleep 0.05; done"
    p = ssh_launcher.launch(spec("sh", "-c", script, host="127.0.0.1"))
    procs.append(p)
    remote = int(cap.value_after("pid"))
    started = time.monotonic()
    assert p.stop(grace=0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 4.0
    wait_for(lambda: not alive(remote), 5, "the remote worker to be killed")


@pytest.mark.parametrize("how", ["kill", "sigkill-ssh"])
def test_killing_the_ssh_launch_kills_the_remote_command(ssh_launcher, cap, procs, how):
    # The remote worker ignores SIGTERM: it must still die (KILL line, or EOF + grace).
    script = "trap '' TERM; echo pid $$; while :; do sleep 0.05; done"
    p = ssh_launcher.launch(spec("sh", "-c", script, host="127.0.0.1"))
    procs.append(p)
    remote = int(cap.value_after("pid"))
    if how == "kill":
        p.kill()
    else:
        os.kill(p.pid, signal.SIGKILL)  # as if the driver had crashed and taken ssh along
    assert p.wait(10) == -signal.SIGKILL
    wait_for(lambda: not alive(remote), 10, "the remote worker to die")


def test_a_killed_ssh_worker_is_sigkilled_whichever_end_closes_first(
    ssh_launcher, cap, procs, monkeypatch
):
    """The remote side may confirm the KILL (ssh then exits 255) before the local SIGKILL
    lands: the status is the launcher's decision, -SIGKILL, not the race's winner."""
    script = "trap '' TERM; echo pid $$; while :; do sleep 0.05; done"
    p = ssh_launcher.launch(spec("sh", "-c", script, host="127.0.0.1"))
    procs.append(p)
    remote = int(cap.value_after("pid"))
    local_signal = p._signal_leader_group

    def remote_side_first(sig):
        p._popen.wait(10)  # ssh ends by itself once the remote KILL cut the session
        local_signal(sig)

    monkeypatch.setattr(p, "_signal_leader_group", remote_side_first)
    p.kill()
    assert p._popen.returncode == 255
    assert p.wait(10) == -signal.SIGKILL
    wait_for(lambda: not alive(remote), 10, "the remote worker to die")


def test_ssh_worker_killed_by_a_signal_reports_128_plus_n(ssh_launcher, cap, procs):
    p = ssh_launcher.launch(spec("sh", "-c", "kill -KILL $$", host="127.0.0.1"))
    procs.append(p)
    assert p.wait(20) == 128 + signal.SIGKILL


def test_ssh_exit_cleans_up_strays_holding_the_output(ssh_launcher, cap, procs):
    p = ssh_launcher.launch(spec("sh", "-c", "sleep 100 & echo stray $!; exit 0", host="127.0.0.1"))
    procs.append(p)
    stray = int(cap.value_after("stray"))
    assert p.wait(20) == 0
    wait_for(lambda: not alive(stray), 10, "the remote stray to be killed")


def test_ssh_connection_failure_is_255(sshd_server, cap, procs):
    launcher = SSHLauncher(
        sshd_server.settings(port=free_port(), connect_timeout=5), cap.out, cap.err
    )
    p = launcher.launch(spec("true", host="127.0.0.1"))
    procs.append(p)
    assert p.wait(20) == 255
    assert p.join_output(5)
    assert "[127.0.0.1:0] ssh: connect to host 127.0.0.1" in cap.stderr()


def test_ssh_binary_missing_is_a_launch_error(cap):
    launcher = SSHLauncher(SSHSettings(ssh_binary="/nonexistent/ssh"), cap.out, cap.err)
    with pytest.raises(LaunchError, match="/nonexistent/ssh"):
        launcher.launch(spec("true", host="127.0.0.1"))
