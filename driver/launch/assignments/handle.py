"""The driver's hold on the per-host agents as processes: which hosts run one
(``uses_agent``), the command line that starts one (``agent_command``), and the handle
on one started or adopted (``AgentProcess``), the reaping of a retired one
(``reap_agent``). ``driver.launch.assignments.launcher`` does the talking."""

from __future__ import annotations

import sys
import threading

from driver.launch.process import REAP_TIMEOUT, STOP_GRACE, WorkerProcess

__all__ = ["AgentProcess", "agent_command", "reap_agent", "uses_agent"]


def uses_agent(host_is_local: bool, store_is_etcd: bool) -> bool:
    """Whether a host's processes go through an agent (see the module docstring)."""
    return store_is_etcd or not host_is_local


def agent_command(job_id: str, host: str, agent_id: str, driver_timeout: float, detach: bool):
    """The command line of the agent of ``host`` (the driver's Python, which every host
    of a job shares, as for the ps shards)."""
    command = [
        sys.executable,
        "-m",
        "driver.agent",
        "--job-id",
        job_id,
        "--host",
        host,
        "--agent-id",
        agent_id,
        "--driver-timeout",
        f"{driver_timeout:g}",
    ]
    return tuple(command + (["--detach"] if detach else []))


class AgentProcess:
    """The driver's hold on one agent: its process (ssh, or local), its id, its state."""

    def __init__(self, host: str, agent_id: str, process: WorkerProcess | None):
        self.host = host
        self.agent_id = agent_id
        self.process = process  # None for an agent a predecessor started (adopted)
        self.registered = threading.Event()
        self.lost = False
        self.retiring = False  # asked to exit (its host was removed): its leaving is no loss
        self.joined = False  # a joined node's own agent (elastic-run --join)
        # Its lease lapsed while the store was in trouble: waited on to register again
        # (``returned`` is set when it does).
        self.lapsed = threading.Event()
        self.returned = threading.Event()

    @property
    def alive(self) -> bool:
        if self.lost or self.retiring:
            return False
        if self.process is None:
            return self.registered.is_set()
        return self.process.poll() is None


def reap_agent(process: WorkerProcess) -> None:
    """Wait for a retired agent's process (its ssh) to end; stop it if it lingers."""
    if process.wait(STOP_GRACE + REAP_TIMEOUT) is None:
        process.stop(STOP_GRACE)
