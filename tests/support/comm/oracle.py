"""The reference results of the collectives: ``benchmarks.harness.comm.oracle``, where the
benchmarks find it too (no benchmark imports ``tests``); named here where the tests
import it."""

from __future__ import annotations

from benchmarks.harness.comm.oracle import reduce_reference

__all__ = ["reduce_reference"]
