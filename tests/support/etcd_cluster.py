"""The etcd clusters the tests run against: ``benchmarks.harness.etcd_cluster``, where the
benchmarks find it too (no benchmark imports ``tests``); named here where the tests
import it."""

from __future__ import annotations

from benchmarks.harness.etcd_cluster import ETCD, EtcdCluster, free_ports

__all__ = ["ETCD", "EtcdCluster", "free_ports"]
