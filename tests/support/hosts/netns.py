"""The test hosts (network, UTS, PID and mount namespaces, each with its sshd):
``benchmarks.harness.netns``, where the benchmarks find it too (no benchmark imports
``tests``); named here where the tests import it."""

from __future__ import annotations

from benchmarks.harness.netns import (
    READY_TIMEOUT,
    SSHD,
    STATE_DIR,
    SUBNET_PREFIX,
    HostsError,
    NetnsHost,
    NetnsHosts,
    reap_abandoned,
    running_hosts,
)

__all__ = [
    "HostsError",
    "NetnsHost",
    "NetnsHosts",
    "READY_TIMEOUT",
    "SSHD",
    "STATE_DIR",
    "SUBNET_PREFIX",
    "reap_abandoned",
    "running_hosts",
]
