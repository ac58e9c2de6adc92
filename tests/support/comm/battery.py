"""The collective battery a communicator worker runs and checks:
``benchmarks.harness.comm.battery``, where the benchmarks find it too (no benchmark
imports ``tests``); named here where the tests import it."""

from __future__ import annotations

from benchmarks.harness.comm.battery import DTYPES, OPS, SHAPES, rank_input, run_battery

__all__ = ["DTYPES", "OPS", "SHAPES", "rank_input", "run_battery"]
