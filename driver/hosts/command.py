"""Running a command that says where the hosts are (the user's discovery script, a
scheduler's CLI): ``run_bounded``, the one way the sources of hosts run a program.

The program runs in its own process group, with the driver's environment and no stdin,
so that a deadline kills whatever it started too; it is always reaped before
``run_bounded`` returns. Every way it can fail is one ``DiscoveryError`` line naming it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from driver.errors import DiscoveryError

_STDERR_TAIL_LINES = 5
_STDERR_TAIL_CHARS = 400
_REAP_TIMEOUT = 5.0  # after SIGKILL to the group; only a stuck kernel call exceeds it


def run_bounded(argv: list[str], timeout: float, source: str) -> str:
    """The standard output of ``argv``, which must exit 0 within ``timeout`` seconds.

    Raises:
        DiscoveryError: it cannot be started, exits non-zero (its status and the tail of
            its stderr), or does not finish in time (it and its group are killed); the
            message starts with ``source``.
    """
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
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_and_reap(process)
        raise DiscoveryError(
            f"{source} did not finish within {timeout:g} s (killed it and its process group)"
        ) from None
    except BaseException:
        # Interrupted (e.g. KeyboardInterrupt): still leave no process behind.
        _kill_and_reap(process)
        raise
    if process.returncode != 0:
        tail = _tail(stderr)
        raise DiscoveryError(
            f"{source} {_describe_exit(process.returncode)}"
            + (f": {tail}" if tail else " (no stderr output)")
        )
    return stdout.decode("utf-8", errors="replace")


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


def _kill_and_reap(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(process.pid, signal.SIGKILL)
    try:
        process.communicate(timeout=_REAP_TIMEOUT)
    except subprocess.TimeoutExpired:
        # A descendant escaped the group (setsid) and still holds our pipes open: stop
        # reading, but still reap the program itself, which SIGKILL has ended.
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        process.wait(timeout=_REAP_TIMEOUT)
