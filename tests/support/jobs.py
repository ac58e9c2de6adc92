"""``elastic-run`` jobs run as the user runs them, and waits with deadlines:
``benchmarks.harness.jobs``, where the benchmarks find it too (no benchmark imports
``tests``); named here where the tests import it."""

from __future__ import annotations

from benchmarks.harness.jobs import (
    EXACT_SUM,
    ElasticRun,
    agents,
    check_exact_sum,
    committed,
    exact_sum_command,
    exact_sum_results,
    formed_round_sizes,
    hold_at,
    hosts_file_discovery,
    pid_alive,
    read_store,
    run_cli,
    wait_until,
    write_hosts,
    write_whole,
)
from tests.support.paths import ROOT, WORKLOADS

__all__ = [
    "EXACT_SUM",
    "ElasticRun",
    "ROOT",
    "WORKLOADS",
    "agents",
    "check_exact_sum",
    "committed",
    "exact_sum_command",
    "exact_sum_results",
    "formed_round_sizes",
    "hold_at",
    "hosts_file_discovery",
    "pid_alive",
    "read_store",
    "run_cli",
    "wait_until",
    "write_hosts",
    "write_whole",
]
