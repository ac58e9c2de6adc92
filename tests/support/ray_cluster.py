"""A Ray cluster on the test hosts: ``benchmarks.harness.ray_cluster``, where the
benchmarks find it too (no benchmark imports ``tests``); named here where the tests
import it."""

from __future__ import annotations

from benchmarks.harness.ray_cluster import (
    HEAD_PORT,
    HEALTH_CHECKS,
    RAY,
    READY_TIMEOUT,
    RayCluster,
    RayError,
)

__all__ = ["HEAD_PORT", "HEALTH_CHECKS", "RAY", "READY_TIMEOUT", "RayCluster", "RayError"]
