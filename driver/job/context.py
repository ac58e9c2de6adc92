"""What the parts of the job's loop share (``JobContext``): one object, made once by the
loop (``driver.job.loop``) and handed to each part (``driver.job.lead``,
``driver.job.actions``, ``driver.job.handlers``), so that none of them holds the loop
itself, and each reads from it only what it uses.

Everything in it is touched from the loop's thread only, except what says otherwise
(``post`` and the event sink are thread-safe; the services, the processes, the adopted
pids and the agents run helper threads of their own, which report to the loop through
``post``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from driver.config import JobConfig
from driver.events import EventSink
from driver.hosts.manager import HostManager
from driver.job.messages import Message
from driver.job.processes import WorkerProcesses
from driver.job.services import JobServices
from driver.job.state import JobState
from driver.launch.agents.service import AgentService
from driver.lead.adopted_pids import AdoptedProcesses
from rendezvous.keys import JobKeys


@dataclass(frozen=True)
class JobContext:
    """The job's collaborators.

    ``config``: the job's validated flags; ``keys``: its key layout in the store;
    ``secret``: the job's secret (handed to every process it starts); ``state``: what
    the loop knows (records, plan, book); ``services``: the store, the claim, the shards,
    the chaos; ``hosts``: the host manager; ``processes``: the worker processes this
    driver holds; ``adopted``: workers a predecessor launched, known by pid; ``agents``:
    the per-host agents (``NoAgents`` when the job runs none);
    ``events``: where events go; ``clock``: the monotonic time the rules see;
    ``all_local``: every process of the job runs on this machine; ``post``: hand a
    message to the loop (thread-safe)."""

    config: JobConfig
    keys: JobKeys
    secret: str
    state: JobState
    services: JobServices
    hosts: HostManager
    processes: WorkerProcesses
    adopted: AdoptedProcesses
    agents: AgentService
    events: EventSink
    clock: Callable[[], float]
    all_local: bool
    post: Callable[[Message], None]
