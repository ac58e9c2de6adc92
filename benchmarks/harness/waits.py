"""Waiting on a condition with a deadline, the benchmarks' way: a timeout is a result
of the run (``BenchTimeout``, written into its line), not a crash."""

from __future__ import annotations

from benchmarks.harness.jobs import wait_until

#: every wait has a deadline: a recovery (torchrun restarts N processes importing
#: torch on a loaded 2-core machine) and reaching a steady world again
RECOVERY_DEADLINE = 120.0
STEADY_DEADLINE = 120.0
FINISH_DEADLINE = 60.0
POLL = 0.01


class BenchTimeout(Exception):
    """A wait ran past its deadline; the message says what was waited for."""


def wait_for(predicate, timeout: float, what: str):
    """Poll ``predicate`` until it returns something true (returned); BenchTimeout after
    ``timeout`` seconds. (The logs are files: polling them is the simplest correct way.)"""
    return wait_until(predicate, timeout, what, interval=POLL, error=BenchTimeout)
