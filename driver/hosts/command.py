"""Running a command that says where the hosts are (the user's discovery script, a
scheduler's CLI): ``Commands.run`` (``run_bounded`` for a one-off), the one way the
sources of hosts run a program.

The program runs in its own process group, with the driver's environment and no stdin,
so that a deadline kills whatever it started too; it is always reaped before ``run``
returns. ``Commands.cancel`` (the job ends) kills the group of every program still
running, from another thread: none outlives the driver. Every way it can fail is one
``DiscoveryError`` line naming it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading

from driver.errors import DiscoveryError

_STDERR_TAIL_LINES = 5
_STDERR_TAIL_CHARS = 400
_REAP_TIMEOUT = 5.0  # after SIGKILL to the group; only a stuck kernel call exceeds it


class Commands:
    """The programs one source of hosts runs (thread-safe): ``run`` one, ``cancel``
    every one still running and any later one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._cancelled = False

    def run(self, argv: list[str], timeout: float, source: str) -> str:
        """The standard output of ``argv``, which must exit 0 within ``timeout`` seconds.

        Raises:
            DiscoveryError: it cannot be started, exits non-zero (its status and the tail
                of its stderr), does not finish in time (it and its group are killed), or
                was cancelled; the message starts with ``source``.
        """
        with self._lock:
            if self._cancelled:
                raise DiscoveryError(f"{source} was not run: the job ends")
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            except OSError as e:
                raise DiscoveryError(f"{source} could not be run: {e.strerror or e}") from None
            self._running.add(process)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_and_reap(process)
            raise DiscoveryError(
                f"{source} did not finish within {timeout:g} s (killed it and its process "
                "group; --discovery-timeout)"
            ) from None
        except BaseException:
            # Interrupted (e.g. KeyboardInterrupt): still leave no process behind.
            _kill_and_reap(process)
            raise
        finally:
            with self._lock:
                self._running.discard(process)
        if self._cancelled:
            raise DiscoveryError(f"{source} was stopped: the job ends")
        if process.returncode != 0:
            tail = _tail(stderr)
            raise DiscoveryError(
                f"{source} {_describe_exit(process.returncode)}"
                + (f": {tail}" if tail else " (no stderr output)")
            )
        return stdout.decode("utf-8", errors="replace")

    def cancel(self) -> None:
        """Kill the group of every program running now (its ``run`` then raises) and
        refuse any later one: the job ends, and nothing it started may outlive it."""
        with self._lock:
            self._cancelled = True
            running = list(self._running)
        for process in running:
            _kill_group(process)


def run_bounded(argv: list[str], timeout: float, source: str) -> str:
    """``Commands().run(argv, timeout, source)``: a program run once, not cancelled.

    Raises:
        DiscoveryError: as ``Commands.run``.
    """
    return Commands().run(argv, timeout, source)


def _tail(data: bytes) -> str:
    """The last lines of a program's stderr, on one line (error messages are one line)."""
    lines = data.decode("utf-8", errors="replace").strip().splitlines()
    tail = " | ".join(line.strip() for line in lines[-_STDERR_TAIL_LINES:] if line.strip())
    return tail if len(tail) <= _STDERR_TAIL_CHARS else "..." + tail[-_STDERR_TAIL_CHARS:]


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(process.pid, signal.SIGKILL)


def _kill_and_reap(process: subprocess.Popen) -> None:
    _kill_group(process)
    try:
        process.communicate(timeout=_REAP_TIMEOUT)
    except subprocess.TimeoutExpired:
        # A descendant escaped the group (setsid) and still holds our pipes open: stop
        # reading, but still reap the program itself, which SIGKILL has ended.
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        process.wait(timeout=_REAP_TIMEOUT)
