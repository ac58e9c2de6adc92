"""Who an agent is (``AgentIdentity``) and how long it waits (``AgentTimings``): what
``driver.agent.loop.Agent`` is given besides its store, its job's keys, its launcher and
its clock."""

from __future__ import annotations

from dataclasses import dataclass

from driver.launch.process import STOP_GRACE
from rendezvous.schema.agents import AGENT_LEASE_TTL

DEFAULT_DRIVER_TIMEOUT = 300.0
"""``--driver-timeout``: seconds an agent keeps its processes with no leader."""


@dataclass(frozen=True)
class AgentIdentity:
    """Who an agent is, as its record (``AgentRecord``) says: its ``host``, its process
    id (``pid``), its id (``agent_id``: "" for one that cannot be retired), its log
    file (``log_path``) and the slots its node offers when it joined the job
    (``elastic-run --join``; 0: a driver started it)."""

    host: str
    pid: int = 0
    agent_id: str = ""
    log_path: str = ""
    slots: int = 0


@dataclass(frozen=True)
class AgentTimings:
    """How long an agent waits: ``driver_timeout``, seconds without a leader before
    everything is stopped; ``stop_grace``, between a process's SIGTERM and its SIGKILL;
    ``lease_ttl``, its record's lease."""

    driver_timeout: float = DEFAULT_DRIVER_TIMEOUT
    stop_grace: float = STOP_GRACE
    lease_ttl: float = AGENT_LEASE_TTL
