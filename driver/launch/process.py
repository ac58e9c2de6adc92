"""A started process's life: its exit, signals to its process group, stop with a grace.

Local processes
---------------
Each process runs in its own session and process group (``start_new_session``), so that
a Ctrl-C in the driver's terminal reaches only the driver (which then stops its workers
in order) and so that ``terminate``/``kill`` reach the process's whole tree. It
inherits the driver's environment plus ``spec.env``, runs in ``spec.cwd``, and reads
nothing (stdin is ``/dev/null``). When the group leader exits, whatever it left behind
in its group is SIGKILLed before the leader is reaped (race-free: the zombie still holds
the group id), so an exited worker never leaves strays holding its pipes. Waiting uses
a pidfd where the kernel has one (no polling).

SSH processes
-------------
The local process is the ssh client; its stdin is the remote wrapper's control channel
(see ``driver.launch.ssh_wrapper``). ``kill()`` SIGKILLs the local ssh at once
(``returncode`` -9): the remote tree then dies through the KILL line or, if ssh dies
before forwarding it, the EOF path. ``stop()`` sends KILL after the grace and waits up
to a second for the remote side to confirm before it kills ssh.

Stopping
--------
``STOP_GRACE`` is the one SIGTERM-to-SIGKILL grace of the driver: ``stop()`` and
``stop_all`` default to it, and the job uses it for the workers it stops and for its ps
shards. Five seconds is what a worker needs to leave its ring and flush its output; a
longer grace only delays the job's end when a worker ignores SIGTERM.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from typing import IO

from driver.errors import LaunchError
from driver.launch.output import OutputForwarder, PrefixFn, Stream, worker_prefix
from driver.launch.spec import LaunchSpec
from driver.launch.ssh_wrapper import CONTROL_KILL, CONTROL_TERM
from rendezvous.retry import Backoff

_PERMANENT_ERRNOS = frozenset(
    {
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EACCES,
        errno.EPERM,
        errno.ENOEXEC,
        errno.EISDIR,
        errno.ELOOP,
        errno.ENAMETOOLONG,
    }
)
"""Errors of exec and chdir that trying again cannot cure (unlike EAGAIN or ENOMEM)."""

STOP_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL when the driver stops a process (see above)."""

REAP_TIMEOUT = 5.0
"""Seconds to wait for a SIGKILLed process to be reapable (it is at once unless the
kernel is stuck in uninterruptible I/O)."""


def start_process(
    argv: list[str],
    spec: LaunchSpec,
    environ: Mapping[str, str],
    cwd: str | None,
    stdin: int | IO[bytes] | None,
) -> subprocess.Popen:
    """``argv`` in a new session with its stdout and stderr piped.

    Raises:
        LaunchError: the program cannot be started (not found, no permission, missing
            working directory); the message names the program (or the directory) and
            ``spec.label``, and says whether every try would fail alike.
    """
    try:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(environ),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        reason = e.strerror or str(e)
        if cwd and e.filename == cwd:  # Popen names the directory it could not enter
            what = f"cannot start {argv[0]!r} in working directory {cwd!r}: {reason}"
        else:
            what = f"cannot start {argv[0]!r}: {reason}"
        raise LaunchError(
            f"{what} (for {spec.label})", permanent=e.errno in _PERMANENT_ERRNOS
        ) from e


class WorkerProcess:
    """One started process (for ssh: the local ssh client that runs it).

    ``rank`` may be set by the driver at every round; the default output prefix reads
    it per line. ``pid`` is the local process id (the ssh client's for ssh workers).
    ``returncode`` is None while running; negative -N means killed by signal N."""

    def __init__(self, spec: LaunchSpec, popen: subprocess.Popen):
        self.spec = spec
        self._popen = popen
        self.rank: int | None = None
        self.forwarder: OutputForwarder | None = None
        self._lock = threading.Lock()
        self._pidfd: int | None = None
        try:
            # Readable once the process exits: waits without polling where supported.
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.spec.label} pid={self.pid} "
            f"rank={self.rank} returncode={self.returncode}>"
        )

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def label(self) -> str:
        return self.spec.label

    def prefix(self) -> str:
        """The current output prefix: ``[rank]``, or ``[label]`` before a rank."""
        return worker_prefix(self.rank, self.spec.label)

    def forward_output(
        self, prefix: PrefixFn | None, out: Stream | None, err: Stream | None
    ) -> None:
        """Start forwarding the process's stdout and stderr, each line prefixed with
        ``prefix()`` (default: ``self.prefix``), and to ``spec.log_path`` if set.

        Raises:
            LaunchError: the log file cannot be opened; the process is then killed
                and reaped, and its pipes closed.
        """
        forwarder = OutputForwarder(
            prefix or self.prefix, out, err, name=self.spec.label, log_path=self.spec.log_path
        )
        self.forwarder = forwarder
        try:
            forwarder.start(self._popen.stdout, self._popen.stderr)
        except OSError as e:
            self.kill()
            self.wait(REAP_TIMEOUT)
            for pipe in (self._popen.stdin, self._popen.stdout, self._popen.stderr):
                if pipe is not None:
                    pipe.close()
            raise LaunchError(
                f"cannot open the output log {self.spec.log_path!r} for {self.spec.label}: {e}"
            ) from e

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def poll(self) -> int | None:
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

    def wait(self, timeout: float | None) -> int | None:
        """Wait up to ``timeout`` seconds (None: no limit) for the exit; the exit code,
        or None if the process still runs at the deadline. Never raises on timeout."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        backoff = Backoff(deadline, initial=0.001, cap=0.05)
        while True:
            rc = self.poll()
            if rc is not None:
                return rc
            if backoff.expired():
                return None
            if not self._wait_pidfd(min(1.0, backoff.remaining())):
                backoff.pause(clip=True)  # no pidfd: poll with growing pauses

    def _wait_pidfd(self, cap: float) -> bool:
        """Block until the pidfd is readable or ``cap`` seconds pass; False without one."""
        pidfd = self._pidfd
        if pidfd is None:
            return False
        try:
            # Capped: a concurrent poll may close the fd and its number be reused.
            select.select([pidfd], [], [], cap)
            return True
        except (OSError, ValueError):
            return False  # closed by a concurrent poll: fall back to sleeping

    def terminate(self) -> None:
        """SIGTERM to the process's whole group (no-op once it has exited)."""
        self._signal_leader_group(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the process's whole group (no-op once it has exited)."""
        self._signal_leader_group(signal.SIGKILL)

    def stop(self, grace: float = STOP_GRACE) -> int | None:
        """Stop the process: ``terminate()``, SIGKILL after ``grace`` seconds if it still
        runs, then reap it. Returns the exit code; None only if the process could not be
        reaped ``REAP_TIMEOUT`` seconds after SIGKILL (a process stuck in the kernel).
        Bounded: never waits longer than ``grace`` plus a few seconds. Also waits up to a
        second for the output pumps, so the process's last lines come out first."""
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
        # The group is gone (or a stray changed user): nothing left to signal.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def _close_pidfd(self) -> None:
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self):
        self._close_pidfd()


class SSHWorkerProcess(WorkerProcess):
    """A worker run through ssh: the local ssh client and the remote wrapper's control
    channel on its stdin (see ``driver.launch.ssh_wrapper``)."""

    def __init__(self, spec: LaunchSpec, popen: subprocess.Popen, env_block: bytes):
        super().__init__(spec, popen)
        self._stdin_lock = threading.Lock()
        self._forced = False
        # Written by a thread: a large environment must not block launch() while ssh is
        # still connecting (it reads stdin only once the session is open).
        self._env_writer = threading.Thread(
            target=self._send_bytes,
            args=(env_block, False),
            name=f"ssh-env-{spec.label}",
            daemon=True,
        )
        self._env_writer.start()

    @property
    def returncode(self) -> int | None:
        """As for a local worker. A worker this launcher SIGKILLed (``kill()``, or
        ``stop()`` escalating) reports ``-SIGKILL`` whichever way its end reached us:
        ssh killed here first (-9), ssh exiting 255 once the remote KILL cut the session,
        or the remote shell's 128+9. Which one wins is a race between the remote side and
        the local signal, so the status is taken from the decision, not from the race."""
        rc = self._popen.returncode
        if self._forced and rc in (255, 128 + signal.SIGKILL, -signal.SIGKILL):
            return -signal.SIGKILL
        return rc

    def poll(self) -> int | None:
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
            self._forced = True
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


def stop_all(processes: Iterable[WorkerProcess], grace: float = STOP_GRACE) -> None:
    """``stop(grace)`` every process at once (SIGTERM, SIGKILL after ``grace``, reap), and
    return when all are done: a job's processes get the same grace, not one after another."""
    stoppers = [threading.Thread(target=p.stop, args=(grace,), daemon=True) for p in processes]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join(timeout=grace + REAP_TIMEOUT + 5)
