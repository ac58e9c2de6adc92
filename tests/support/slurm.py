"""A Slurm cluster on the test hosts: ``benchmarks.harness.slurm``, where the benchmarks
find it too (no benchmark imports ``tests``); named here where the tests import it."""

from __future__ import annotations

from benchmarks.harness.slurm import (
    CONTROLLER,
    PREEMPT_GRACE,
    READY_TIMEOUT,
    URGENT,
    SlurmCluster,
    SlurmError,
)

__all__ = ["CONTROLLER", "PREEMPT_GRACE", "READY_TIMEOUT", "SlurmCluster", "SlurmError", "URGENT"]
