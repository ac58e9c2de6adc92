"""The communicator tests' pool of real worker processes (``workers``, a pytest fixture):
``benchmarks.harness.comm.workers.Workers``, reaped even when the test fails."""

from __future__ import annotations

import pytest

from benchmarks.harness.comm.workers import Worker, Workers

__all__ = ["Worker", "Workers", "workers"]


@pytest.fixture
def workers():
    """A pool of real worker processes, reaped even when the test fails."""
    pool = Workers()
    try:
        yield pool
    finally:
        pool.reap()
