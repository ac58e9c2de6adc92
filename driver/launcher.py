"""Starting worker processes on a host, locally or over ssh, and stopping them.

``get_launcher(name, ...)`` returns a ``Launcher`` (``"local"``, ``"ssh"`` or ``"auto"``);
``launcher.launch(spec)`` starts one worker and returns a ``WorkerProcess``; its output is
forwarded, prefixed, to the driver's stdout/stderr by ``driver.output.OutputForwarder``.

Local workers
-------------
Each worker runs in its own session and process group (``start_new_session``), so that
a Ctrl-C in the driver's terminal reaches only the driver (which then stops its workers
in order) and so that ``terminate``/``kill`` reach the worker's whole process tree. The
worker inherits the driver's environment plus ``spec.env``, runs in ``spec.cwd``, and
reads nothing (stdin is ``/dev/null``). When the group leader exits, whatever it left
behind in its group is SIGKILLed before the leader is reaped (race-free: the zombie
still holds the group id), so an exited worker never leaves strays holding its pipes.

SSH workers
-----------
``ssh [options] -- HOST 'exec /bin/sh -c SCRIPT'`` runs a small POSIX-sh wrapper
(``remote_script``) on the host. The ssh process's stdin is the wrapper's control
channel (``encode_env_block`` then control lines):

1. the environment: ``NAME=VALUE`` lines up to an empty line. The variables travel on
   stdin, not on the command line, so that the job secret (``ELASTIC_JOB_SECRET``) never
   shows in ``ps`` on the remote host. What is sent is ``spec.env`` over the driver's
   environment minus the host- and session-specific variables of ``NOT_FORWARDED``
   (HOME, USER, SHELL, SSH_*, XDG_*, TMPDIR, ...) and minus ``SSHSettings.env_exclude``;
   ``SSHSettings(forward_env=False)`` sends ``spec.env`` only. This is the contract's
   "workers inherit elastic-run's environment plus the job's own variables", with PATH,
   PYTHONPATH, VIRTUAL_ENV, ELASTIC_* and anything the user exported included, on the
   usual assumption of identical paths on every host (as with ``mpirun -x``).
2. then ``TERM`` or ``KILL`` lines: the wrapper's watchdog signals the session's process
   group (the worker's whole tree) with that signal.
3. end of file: the driver closed the pipe, the driver died, or the connection is
   gone. sshd does *not* signal a command that has no tty when its connection drops, so
   without this watchdog a killed ssh client would orphan the remote worker. On EOF the
   watchdog sends SIGTERM to the group and SIGKILL after ``SSHSettings.remote_grace``
   seconds (sooner if the worker is gone). The same happens after a normal exit (sshd
   closes the pipe), which also cleans up strays the worker left behind.

The worker runs in the foreground of the wrapper, which ignores the group SIGTERM and
exits with the worker's status, so a worker's exit code comes back through ssh. A
worker killed by signal N reports 128+N over ssh (the shell's convention; locally it is
-N as in ``subprocess``), and 255 means ssh itself failed (or the command exited 255).
``kill()`` SIGKILLs the local ssh at once (``returncode`` -9): the remote tree then
dies through the KILL line or, if ssh dies before forwarding it, the EOF path.
``stop()`` sends KILL and waits up to a second for the remote side to confirm before it
kills ssh. A connection that hangs without closing is noticed locally through
``ServerAliveInterval``; the remote side relies on sshd's TCP keep-alive (set
``ClientAliveInterval`` on the hosts for faster cleanup after a network partition).

The login shell on the host must parse ``exec /bin/sh -c '...'`` (sh, bash, dash, zsh,
ksh, fish and csh do: the script has no newline, backslash or ``!``).
"""
from __future__ import annotations

import abc
import fnmatch
import math
import os
import re
import select
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from rendezvous import env
from rendezvous.errors import ElasticError

from driver.output import OutputForwarder, PrefixFn, Stream, worker_prefix

# ----------------------------------------------------------------------------- errors


class LauncherError(ElasticError):
    """Base of the errors of this module."""


class LaunchSpecError(LauncherError, ValueError):
    """A ``LaunchSpec`` or ``SSHSettings`` value is unusable (empty command, bad variable
    name, a host that looks like an option, ...)."""


class LaunchError(LauncherError):
    """The worker process could not be started (command or ``ssh`` not found, missing
    working directory, no permission). Failures after the start are exit codes."""


class UnknownLauncherError(LauncherError, ValueError):
    """``get_launcher`` was given a name it does not know."""


# ----------------------------------------------------------------------------- specs

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

STOP_GRACE = 10.0
"""Default seconds between SIGTERM and SIGKILL in ``WorkerProcess.stop``."""

REAP_TIMEOUT = 5.0
"""Seconds to wait for a SIGKILLed process to be reapable (it is at once unless the
kernel is stuck in uninterruptible I/O)."""


def valid_env_name(name: str) -> bool:
    """True if ``name`` can be a shell variable (and so can be set on a remote host)."""
    return isinstance(name, str) and bool(_ENV_NAME.match(name))


@dataclass(frozen=True)
class LaunchSpec:
    """What to start, where, and how to label its output.

    ``env`` holds the job's own variables, added to the inherited environment; it is
    copied, so later changes of the caller's dict do not leak in. ``cwd`` None means
    the driver's working directory at launch time (on an ssh host too). ``label``
    defaults to ``host:slot`` and prefixes output lines until a rank is known.
    ``log_path``, if set, receives the worker's output lines unprefixed (``--log-dir``).
    Raises ``LaunchSpecError`` for an empty command, non-string arguments, a negative
    slot, a variable name that is not ``[A-Za-z_][A-Za-z0-9_]*`` or a value with NUL."""
    host: str
    slot: int
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    cwd: Optional[str] = None
    label: str = ""
    log_path: Optional[str] = None

    def __post_init__(self):
        command = tuple(self.command) if not isinstance(self.command, str) else None
        if not command or not all(isinstance(a, str) for a in command):
            raise LaunchSpecError(f"command must be a non-empty sequence of strings, "
                                  f"got {self.command!r}")
        if any("\0" in a for a in command):
            raise LaunchSpecError("command arguments must not contain NUL")
        if not isinstance(self.host, str) or not self.host:
            raise LaunchSpecError(f"host must be a non-empty string, got {self.host!r}")
        if not isinstance(self.slot, int) or self.slot < 0:
            raise LaunchSpecError(f"slot must be a non-negative int, got {self.slot!r}")
        env = dict(self.env)
        for name, value in env.items():
            if not valid_env_name(name):
                raise LaunchSpecError(f"bad environment variable name {name!r}")
            if not isinstance(value, str) or "\0" in value:
                raise LaunchSpecError(f"environment variable {name} must be a string "
                                      f"without NUL, got {value!r}")
        # Frozen: the normalized values are set once, here.
        object.__setattr__(self, "command", command)
        object.__setattr__(self, "env", env)
        object.__setattr__(self, "label", self.label or f"{self.host}:{self.slot}")


@dataclass(frozen=True)
class SSHSettings:
    """How ``SSHLauncher`` runs ssh.

    ``extra_options`` are raw ssh arguments placed before the defaults, so that an
    ``-o Name=value`` there wins (ssh keeps the first value it sees for an option).
    ``remote_grace`` is the time between SIGTERM and SIGKILL on the remote host when the
    connection is lost (rounded up to whole seconds). ``forward_env`` and
    ``env_exclude`` (``fnmatch`` patterns) choose which of the driver's variables go to
    the worker (see the module docstring). Raises ``LaunchSpecError`` for a bad value."""
    port: Optional[int] = None
    identity_file: Optional[str] = None
    user: Optional[str] = None
    ssh_binary: str = "ssh"
    connect_timeout: float = 10.0
    server_alive_interval: float = 5.0
    server_alive_count: int = 3
    remote_grace: float = 5.0
    forward_env: bool = True
    env_exclude: tuple[str, ...] = ()
    extra_options: tuple[str, ...] = ()

    def __post_init__(self):
        if self.port is not None and not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise LaunchSpecError(f"ssh port must be 1..65535, got {self.port!r}")
        for name in ("connect_timeout", "server_alive_interval", "remote_grace"):
            if not getattr(self, name) > 0:
                raise LaunchSpecError(f"SSHSettings.{name} must be > 0")
        if not (isinstance(self.server_alive_count, int) and self.server_alive_count > 0):
            raise LaunchSpecError("SSHSettings.server_alive_count must be a positive int")
        object.__setattr__(self, "env_exclude", tuple(self.env_exclude))
        object.__setattr__(self, "extra_options", tuple(self.extra_options))


ENV_SSH_OPTIONS = env.ENV_SSH_OPTIONS


def ssh_settings_from_env(environ: Mapping[str, str]) -> SSHSettings:
    """``SSHSettings`` whose extra options come from ``ELASTIC_SSH_OPTIONS`` (shell words,
    e.g. ``-p 2222 -i ~/.ssh/cluster -o ProxyJump=gw``): how a user points elastic-run's
    ssh at their cluster without a flag per ssh option. ~/.ssh/config works as usual.
    Raises LaunchSpecError when the value does not split into words."""
    text = environ.get(ENV_SSH_OPTIONS, "")
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:
        raise LaunchSpecError(f"{ENV_SSH_OPTIONS}={text!r}: {exc}") from None
    return SSHSettings(extra_options=words)


# ----------------------------------------------------------------------------- pure: ssh

NOT_FORWARDED = (
    # who and where the user is on *this* machine: the remote login sets its own
    "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "SHLVL", "HOSTNAME", "MAIL", "_",
    "TMPDIR",
    # the driver's terminal and desktop session
    "TERM", "TERMCAP", "COLUMNS", "LINES", "DISPLAY", "XAUTHORITY", "WINDOWID", "STY",
    "WINDOW", "TMUX", "TMUX_PANE", "LS_COLORS", "PS1", "PS2", "PROMPT_COMMAND",
    "SSH_*", "XDG_*", "DBUS_*", "GPG_AGENT_INFO", "KRB5CCNAME",
)
"""Driver variables (``fnmatch`` patterns) never sent to an ssh worker."""

CONTROL_TERM = "TERM"
CONTROL_KILL = "KILL"


def remote_environment(spec_env: Mapping[str, str], driver_env: Mapping[str, str],
                       settings: SSHSettings) -> dict[str, str]:
    """The variables an ssh worker gets on top of its login environment: the driver's
    (unless ``forward_env`` is off) minus ``NOT_FORWARDED`` and ``env_exclude`` and minus
    names a shell cannot set (e.g. ``BASH_FUNC_x%%``), then ``spec_env`` over them."""
    env: dict[str, str] = {}
    if settings.forward_env:
        patterns = NOT_FORWARDED + settings.env_exclude
        for name, value in driver_env.items():
            if (valid_env_name(name) and "\0" not in value
                    and not any(fnmatch.fnmatchcase(name, p) for p in patterns)):
                env[name] = value
    env.update(spec_env)
    return env


def encode_env_block(env: Mapping[str, str]) -> bytes:
    """The environment part of the wrapper's stdin: one ``NAME=VALUE`` line per variable
    and an empty line. A value with a newline or backslash is sent as ``:NAME=ESCAPED``
    with backslash escapes (``\\\\`` and ``\\n``) that the wrapper decodes with
    ``printf %b``; plain values go as they are. Raises ``LaunchSpecError`` for a name a
    shell cannot set."""
    lines = []
    for name, value in env.items():
        if not valid_env_name(name):
            raise LaunchSpecError(f"bad environment variable name {name!r}")
        if "\n" in value or "\\" in value:
            escaped = value.replace("\\", "\\\\").replace("\n", "\\n")
            lines.append(f":{name}={escaped}")
        else:
            lines.append(f"{name}={value}")
    return ("".join(line + "\n" for line in lines) + "\n").encode("utf-8", "surrogateescape")


def remote_script(command: tuple[str, ...], cwd: str, remote_grace: float) -> str:
    """The POSIX-sh wrapper run on the ssh host (see the module docstring), on one line.

    Reads the environment block from stdin (exits 125 if the stream ends before the
    empty line), ``cd``s to ``cwd`` (exits 1 if it cannot), starts the stdin watchdog in
    the background, and runs ``command`` in the foreground with stdin from /dev/null,
    exiting with its status. Variables of the wrapper itself start with ``__er_`` and
    are not exported."""
    grace = max(1, math.ceil(remote_grace))
    # No newline, backslash or "!" anywhere (csh and fish parse the outer quoting).
    read_env = (
        "__er_ok=; "
        "while IFS= read -r __er_l; do "
        '[ -z "$__er_l" ] && { __er_ok=1; break; }; '
        'case $__er_l in '
        ':*) __er_l=${__er_l#:}; __er_v=$(printf %bx "${__er_l#*=}"); __er_v=${__er_v%x} ;; '
        '*) __er_v=${__er_l#*=} ;; '
        'esac; '
        'export "${__er_l%%=*}=$__er_v"; '
        "done; "
        '[ -n "$__er_ok" ] || exit 125; '
        "unset __er_ok __er_l __er_v; "
    )
    watchdog = (
        "( trap '' TERM; PATH=/usr/bin:/bin:$PATH; "
        "while IFS= read -r __er_c; do "
        f'case $__er_c in {CONTROL_TERM}) kill -TERM 0 ;; {CONTROL_KILL}) kill -KILL 0 ;; esac; '
        "done; "
        "kill -TERM 0; __er_i=0; "
        f'while [ $__er_i -lt {grace} ] && kill -0 $$ 2>/dev/null; do '
        "sleep 1; __er_i=$((__er_i+1)); done; "
        # fd 3: a background list's stdin would be /dev/null without job control.
        "kill -KILL 0 ) <&3 >/dev/null 2>&1 3<&- & "
    )
    return (
        read_env
        + "exec 3<&0; "
        + f"cd -- {shlex.quote(cwd)} || exit 1; "
        # A handler, not an ignore: the worker (forked later) gets the default action,
        # while this shell outlives the group SIGTERM to report the worker's status.
        + "trap : TERM; "
        + watchdog
        + f"{shlex.join(command)} </dev/null 3<&-; exit $?"
    )


def ssh_argv(host: str, remote_command: str, settings: SSHSettings) -> list[str]:
    """The local argv that runs ``remote_command`` on ``host``. Raises ``LaunchSpecError``
    for a host that is empty, has whitespace or starts with ``-``."""
    if not host or host.startswith("-") or any(c.isspace() for c in host):
        raise LaunchSpecError(f"bad ssh host {host!r}")
    argv = [settings.ssh_binary, *settings.extra_options,
            "-T", "-x",
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no",
            # Hides "Permanently added ... to the list of known hosts" on every worker.
            "-o", "LogLevel=ERROR",
            "-o", f"ConnectTimeout={max(1, math.ceil(settings.connect_timeout))}",
            "-o", f"ServerAliveInterval={max(1, math.ceil(settings.server_alive_interval))}",
            "-o", f"ServerAliveCountMax={settings.server_alive_count}"]
    if settings.port is not None:
        argv += ["-p", str(settings.port)]
    if settings.identity_file is not None:
        argv += ["-i", settings.identity_file, "-o", "IdentitiesOnly=yes"]
    if settings.user is not None:
        argv += ["-l", settings.user]
    return argv + ["--", host, remote_command]


def ssh_remote_command(spec: LaunchSpec, cwd: str, settings: SSHSettings) -> str:
    """The one string ssh passes to the remote login shell."""
    return "exec /bin/sh -c " + shlex.quote(remote_script(spec.command, cwd, settings.remote_grace))


# ----------------------------------------------------------------------------- processes


class WorkerProcess:
    """One started worker (for ssh: the local ssh client that runs it).

    ``rank`` may be set by the driver at every round; the default output prefix reads
    it per line. ``pid`` is the local process id (the ssh client's for ssh workers).
    ``returncode`` is None while running; negative -N means killed by signal N."""

    def __init__(self, spec: LaunchSpec, popen: subprocess.Popen):
        self.spec = spec
        self._popen = popen
        self.rank: Optional[int] = None
        self.forwarder: Optional[OutputForwarder] = None
        self._lock = threading.Lock()
        self._pidfd: Optional[int] = None
        try:
            # Readable once the process exits: waits without polling where supported.
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.spec.label} pid={self.pid} "
                f"rank={self.rank} returncode={self.returncode}>")

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def label(self) -> str:
        return self.spec.label

    def prefix(self) -> str:
        """The current output prefix: ``[rank]``, or ``[host:slot]`` before a rank."""
        return worker_prefix(self.rank, self.spec.label)

    @property
    def returncode(self) -> Optional[int]:
        return self._popen.returncode

    def poll(self) -> Optional[int]:
        """The exit code if the process has exited (reaping it), else None."""
        with self._lock:
            if self._popen.returncode is not None:
                return self._popen.returncode
            try:
                # WNOWAIT: see the exit without reaping, so the group id is still ours
                # while the strays are killed (no pid-reuse race).
                info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                # Reaped behind our back: the group id may already be reused, so no
                # signal; Popen reports what it can.
                info = None
                rc = self._popen.poll()
                if rc is not None:
                    self._close_pidfd()
                return rc
            if info is None:
                return None
            self._kill_group(signal.SIGKILL)
            rc = self._popen.poll()
            if rc is not None:
                self._close_pidfd()
            return rc

    def wait(self, timeout: Optional[float]) -> Optional[int]:
        """Wait up to ``timeout`` seconds (None: no limit) for the exit; the exit code,
        or None if the process still runs at the deadline. Never raises on timeout."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        delay = 0.001
        while True:
            rc = self.poll()
            if rc is not None:
                return rc
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            pidfd = self._pidfd
            if pidfd is not None:
                try:
                    # Capped: a concurrent poll may close the fd and its number be reused.
                    cap = 1.0 if remaining is None else min(1.0, remaining)
                    select.select([pidfd], [], [], cap)
                    continue
                except (OSError, ValueError):
                    pass  # closed by a concurrent poll: fall back to sleeping
            delay = min(delay * 2, 0.05)
            time.sleep(delay if remaining is None else min(delay, remaining))

    def terminate(self) -> None:
        """SIGTERM to the worker's whole process group (no-op once it has exited)."""
        self._signal_leader_group(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the worker's whole process group (no-op once it has exited)."""
        self._signal_leader_group(signal.SIGKILL)

    def stop(self, grace: float = STOP_GRACE) -> Optional[int]:
        """Stop the worker: ``terminate()``, SIGKILL after ``grace`` seconds if it still
        runs, then reap it. Returns the exit code; None only if the process could not be
        reaped ``REAP_TIMEOUT`` seconds after SIGKILL (a process stuck in the kernel).
        Bounded: never waits longer than ``grace`` plus a few seconds. Also waits up to a
        second for the output pumps, so the worker's last lines come out first."""
        if self.poll() is None:
            self.terminate()
            if self.wait(grace) is None:
                self._escalate()
        rc = self.wait(REAP_TIMEOUT)
        self.join_output(1.0)
        return rc

    def join_output(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the output pumps to reach EOF."""
        return self.forwarder.join(timeout) if self.forwarder is not None else True

    # -- internals

    def _escalate(self) -> None:
        self.kill()

    def _signal_leader_group(self, sig: int) -> None:
        with self._lock:
            if self._popen.returncode is None:
                # The leader is not reaped, so its pid is still our group's id.
                self._kill_group(sig)

    def _kill_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone (or a stray changed user): nothing left to signal

    def _close_pidfd(self) -> None:
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self):
        self._close_pidfd()


class SSHWorkerProcess(WorkerProcess):
    """A worker run through ssh: the local ssh client and the remote wrapper's control
    channel on its stdin (see the module docstring)."""

    def __init__(self, spec: LaunchSpec, popen: subprocess.Popen, env_block: bytes):
        super().__init__(spec, popen)
        self._stdin_lock = threading.Lock()
        self._forced = False
        # Written by a thread: a large environment must not block launch() while ssh is
        # still connecting (it reads stdin only once the session is open).
        self._env_writer = threading.Thread(target=self._send_bytes, args=(env_block, False),
                                            name=f"ssh-env-{spec.label}", daemon=True)
        self._env_writer.start()

    @property
    def returncode(self) -> Optional[int]:
        rc = self._popen.returncode
        # After stop() escalated, ssh reports the remote SIGKILL as 255: say it like a
        # local worker would.
        if self._forced and rc == 255:
            return -signal.SIGKILL
        return rc

    def poll(self) -> Optional[int]:
        rc = super().poll()
        return self.returncode if rc is not None else None

    def terminate(self) -> None:
        """Ask the remote wrapper to SIGTERM the worker's group; ssh then exits with the
        worker's status. If the control channel is gone, SIGTERM the local ssh."""
        if self.poll() is None and not self._send(CONTROL_TERM):
            self._signal_leader_group(signal.SIGTERM)

    def kill(self) -> None:
        """Send KILL to the remote wrapper and SIGKILL the local ssh at once."""
        if self.poll() is None:
            self._send(CONTROL_KILL)
            self._close_stdin()
            self._signal_leader_group(signal.SIGKILL)

    def _escalate(self) -> None:
        # Give the remote side a moment to confirm the KILL (ssh then exits by itself)
        # before killing the local ssh, so the remote tree is known to be gone.
        self._forced = True
        self._send(CONTROL_KILL)
        self._close_stdin()
        if self.wait(1.0) is None:
            self._signal_leader_group(signal.SIGKILL)

    def _send(self, word: str) -> bool:
        return self._send_bytes(word.encode() + b"\n", True)

    def _send_bytes(self, data: bytes, bounded: bool) -> bool:
        # bounded: a control line must not wait behind a blocked environment write.
        if not self._stdin_lock.acquire(timeout=1.0 if bounded else -1):
            return False
        try:
            stdin = self._popen.stdin
            if stdin is None or stdin.closed:
                return False
            stdin.write(data)
            stdin.flush()
            return True
        except (OSError, ValueError):
            return False  # ssh is gone or closed its stdin
        finally:
            self._stdin_lock.release()

    def _close_stdin(self) -> None:
        if self._stdin_lock.acquire(timeout=1.0):
            try:
                if self._popen.stdin is not None:
                    self._popen.stdin.close()
            except OSError:
                pass
            finally:
                self._stdin_lock.release()


# ----------------------------------------------------------------------------- launchers


class Launcher(abc.ABC):
    """Starts workers. ``out``/``err`` are where their output goes (default: the
    driver's ``sys.stdout``/``sys.stderr`` at the time of each line)."""

    name = "abstract"

    def __init__(self, out: Optional[Stream] = None, err: Optional[Stream] = None):
        self.out = out
        self.err = err

    @abc.abstractmethod
    def launch(self, spec: LaunchSpec, prefix: Optional[PrefixFn] = None) -> WorkerProcess:
        """Start the worker of ``spec``; its output is forwarded with ``prefix()`` (default:
        ``[rank]`` from ``WorkerProcess.rank``, ``[host:slot]`` before a rank). Raises
        ``LaunchError`` if the process cannot be started, ``LaunchSpecError`` for a spec
        this launcher cannot run."""

    def _forward(self, proc: WorkerProcess, prefix: Optional[PrefixFn],
                 on_stdout_line: Optional[Callable[[bytes], bool]] = None) -> None:
        forwarder = OutputForwarder(prefix or proc.prefix, self.out, self.err,
                                    name=proc.spec.label, log_path=proc.spec.log_path,
                                    on_stdout_line=on_stdout_line)
        proc.forwarder = forwarder
        try:
            forwarder.start(proc._popen.stdout, proc._popen.stderr)
        except OSError as e:
            proc.kill()
            proc.wait(REAP_TIMEOUT)
            for pipe in (proc._popen.stdin, proc._popen.stdout, proc._popen.stderr):
                if pipe is not None:
                    pipe.close()
            raise LaunchError(f"cannot open the output log {proc.spec.log_path!r} "
                              f"for {proc.spec.label}: {e}") from e


def _popen(argv: list[str], spec: LaunchSpec, env: Mapping[str, str], cwd: Optional[str],
           stdin) -> subprocess.Popen:
    try:
        return subprocess.Popen(argv, cwd=cwd, env=dict(env), stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, close_fds=True)
    except OSError as e:
        where = f" in {cwd!r}" if cwd else ""
        raise LaunchError(f"cannot start {argv[0]!r}{where} for {spec.label}: "
                          f"{e.strerror or e}") from e


class LocalLauncher(Launcher):
    """Runs every worker on this machine, whatever its host name (handy to simulate
    hosts in tests)."""

    name = "local"

    def launch(self, spec: LaunchSpec, prefix: Optional[PrefixFn] = None,
               on_stdout_line: Optional[Callable[[bytes], bool]] = None) -> WorkerProcess:
        env = {**os.environ, **spec.env}
        popen = _popen(list(spec.command), spec, env, spec.cwd, subprocess.DEVNULL)
        proc = WorkerProcess(spec, popen)
        self._forward(proc, prefix, on_stdout_line)
        return proc


class SSHLauncher(Launcher):
    """Runs every worker through ``ssh HOST`` with ``settings``."""

    name = "ssh"

    def __init__(self, settings: Optional[SSHSettings] = None, out: Optional[Stream] = None,
                 err: Optional[Stream] = None):
        super().__init__(out, err)
        self.settings = settings or SSHSettings()

    def launch(self, spec: LaunchSpec, prefix: Optional[PrefixFn] = None) -> WorkerProcess:
        cwd = spec.cwd or os.getcwd()
        argv = ssh_argv(spec.host, ssh_remote_command(spec, cwd, self.settings), self.settings)
        env_block = encode_env_block(remote_environment(spec.env, os.environ, self.settings))
        # ssh itself runs with the driver's environment (HOME, SSH_AUTH_SOCK) and cwd.
        popen = _popen(argv, spec, os.environ, None, subprocess.PIPE)
        proc = SSHWorkerProcess(spec, popen, env_block)
        self._forward(proc, prefix)
        return proc


class AutoLauncher(Launcher):
    """Local for hosts that name this machine, ssh for the others.

    ``is_local(host) -> bool`` decides (default: ``driver.discovery.is_local_host``)."""

    name = "auto"

    def __init__(self, settings: Optional[SSHSettings] = None, out: Optional[Stream] = None,
                 err: Optional[Stream] = None,
                 is_local: Optional[Callable[[str], bool]] = None):
        super().__init__(out, err)
        self.local = LocalLauncher(out, err)
        self.ssh = SSHLauncher(settings, out, err)
        if is_local is None:
            from driver.discovery import is_local_host as is_local
        self.is_local = is_local

    def launch(self, spec: LaunchSpec, prefix: Optional[PrefixFn] = None) -> WorkerProcess:
        chosen = self.local if self.is_local(spec.host) else self.ssh
        return chosen.launch(spec, prefix)


def stop_all(processes, grace: float = STOP_GRACE) -> None:
    """``stop(grace)`` every process at once (SIGTERM, SIGKILL after ``grace``, reap), and
    return when all are done: a job's processes get the same grace, not one after another."""
    stoppers = [threading.Thread(target=p.stop, args=(grace,), daemon=True) for p in processes]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join(timeout=grace + REAP_TIMEOUT + 5)


LAUNCHER_NAMES = ("local", "ssh", "auto")


def get_launcher(name: str, *, ssh_settings: Optional[SSHSettings] = None,
                 out: Optional[Stream] = None, err: Optional[Stream] = None,
                 is_local: Optional[Callable[[str], bool]] = None) -> Launcher:
    """The launcher called ``name`` (one of ``LAUNCHER_NAMES``). Raises
    ``UnknownLauncherError`` for any other name."""
    if name == "local":
        return LocalLauncher(out, err)
    if name == "ssh":
        return SSHLauncher(ssh_settings, out, err)
    if name == "auto":
        return AutoLauncher(ssh_settings, out, err, is_local)
    raise UnknownLauncherError(f"unknown launcher {name!r} (choose from "
                               f"{', '.join(LAUNCHER_NAMES)})")
