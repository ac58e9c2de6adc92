"""What the driver's side of the agents knows (``AgentBook``): the agents by host and
the processes assigned through them, shared by the launcher, which writes assignments
(``driver.launch.assignments.launcher``), and the agents' reports, which read the
store's news of them (``driver.launch.assignments.reports``), under one lock: a host
lost takes its agent and its processes' handles together.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from driver.launch.assignments.assigned import AssignedProcess
from driver.launch.assignments.handle import AgentProcess
from rendezvous.schema.agents import Assignment


@dataclass
class AgentBook:
    """Under ``lock``: the ``agents`` by host; each assigned process's ``handles``, host
    (``hosts_of``) and ``assignments``, by process id; ``closing``: the job ends (agents
    leave on purpose)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    agents: dict[str, AgentProcess] = field(default_factory=dict)
    handles: dict[str, AssignedProcess] = field(default_factory=dict)
    hosts_of: dict[str, str] = field(default_factory=dict)
    assignments: dict[str, Assignment] = field(default_factory=dict)
    closing: bool = False
