"""Run a command to its end in a session of its own, for tests whose command may start
children (mpiexec's ranks, forked workers) and may hang.

On timeout the whole session is killed (the command and every child it started), so
nothing outlives the test; the test then fails on the exit code (-9) and sees the
output so far, ending with a line that says it was killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

from tests.support.paths import ROOT


def run_in_session(
    argv: Sequence[str], env: Mapping[str, str], timeout: float, *, merge_stderr: bool = False
) -> subprocess.CompletedProcess[str]:
    """``argv`` run from the repository's root with ``env``; its exit code, stdout and
    stderr (stderr into stdout with ``merge_stderr``) as text."""
    proc = subprocess.Popen(
        list(argv),
        cwd=ROOT,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        killed = f"\n(killed with its session after {timeout:.0f} s)"
        if merge_stderr:
            out += killed
        else:
            err += killed
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err or "")
