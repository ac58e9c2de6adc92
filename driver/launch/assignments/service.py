"""What the job's loop asks of the per-host agents (``AgentService``), and the service of a
job that runs none (``NoAgents``).

``elastic-run``'s own launcher is an ``AgentService`` too
(``driver.launch.assignments.launcher.AgentLauncher``): it starts the agents and talks to them
through the store. A job given a launcher of its own (tests drive the loop with fake
processes) has no agents: it gets ``NoAgents``, which adopts nothing, follows nothing
and knows no host, so the loop asks the same questions either way.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Callable, Protocol

from driver.launch.process import WorkerProcess
from rendezvous.store import Delete, KeyValue, KVStore, Put


@dataclass(frozen=True)
class AgentStarts:
    """How a job's agents are started: for job ``job_id``, each keeping its processes
    ``driver_timeout`` seconds without a leader, ``detach``ed from the ssh session (a
    job whose store outlives its driver); ``joined``: the nodes run their own agents
    (``elastic-run --join``), and ``starts_agents``: agents are started for the other
    hosts (in join mode, those of ``-H`` or a script)."""

    job_id: str
    driver_timeout: float
    detach: bool
    joined: bool = False
    starts_agents: bool = True


class Leader(Protocol):
    """The lead the agents' writes are fenced on (``driver.job.fenced.FencedStore``)."""

    def term(self) -> int:
        """The leader's term, stamped on assignments."""
        ...

    def steer(self, ops: Sequence[Put | Delete]) -> int:
        """Write ``ops`` fenced on the lead.

        Raises:
            LeadershipLost: another driver leads.
            RendezvousError: the store cannot be used.
        """
        ...


@dataclass(frozen=True)
class AgentWiring:
    """What the agents need of the job once its store is open: the ``store``, the
    variables agents start with (``agent_env``: store URL, job id, secret), what to do
    when a host's agent is lost (``on_host_lost(host, detail)``) and when one first
    registers (``on_host_ready(host)``), how long a watch may go without the store
    (``patience``), the ``leader`` (its term stamped on assignments, its fenced write;
    None: term 1 and plain puts), and
    whether the store was in trouble just before now (``store_trouble()``, within
    ``driver.policy.lapses.LAPSE_WINDOW``: an agent's lapsed lease may then be the
    store's doing, ``driver.job.store_trouble``)."""

    store: KVStore
    agent_env: Mapping[str, str]
    on_host_lost: Callable[[str, str], None]
    patience: float
    leader: Leader | None = None
    on_host_ready: Callable[[str], None] = lambda host: None
    store_trouble: Callable[[], bool] = lambda: False


class AgentService(abc.ABC):
    """The per-host agents, as the job's loop uses them."""

    @abc.abstractmethod
    def adopt(self, kvs: Sequence[KeyValue]) -> Mapping[str, WorkerProcess]:
        """Take over the agents and processes a predecessor left (its job's keys
        ``kvs``); returns a handle for each process still running, by process id."""

    @abc.abstractmethod
    def attach(self, wiring: AgentWiring) -> None:
        """Use the job's store from now on, as ``wiring`` says."""

    @abc.abstractmethod
    def live_hosts(self) -> frozenset[str]:
        """Hosts with a registered agent that is neither lost nor retiring."""

    @abc.abstractmethod
    def node_hosts(self) -> frozenset[str]:
        """Of ``live_hosts``, the joined nodes (``elastic-run --join``): each brought
        its own agent, which the job neither starts nor retires."""

    @abc.abstractmethod
    def busy_hosts(self) -> frozenset[str]:
        """Hosts where a process assigned through an agent has not been reported ended."""

    @abc.abstractmethod
    def lost_hosts(self) -> frozenset[str]:
        """Hosts whose agent was lost (until a new agent is started there)."""

    @abc.abstractmethod
    def retire(self, host: str) -> None:
        """Ask the agent of ``host`` to exit (discovery removed the host, nothing runs
        there)."""

    @abc.abstractmethod
    def ready_hosts(self, hosts: Sequence[str]) -> frozenset[str]:
        """Of ``hosts``, those where a process can be started now: a host whose
        processes go through an agent once its agent is live, any other at once."""

    @abc.abstractmethod
    def prepare(self, host: str) -> None:
        """Start the agent of ``host`` in the background, when its processes go through
        one and none is live or starting there: ``on_host_ready`` follows its
        registration, ``on_host_lost`` a start that failed."""

    @abc.abstractmethod
    def close(self, tell: bool = True) -> None:
        """The job is over: every agent stops what it runs and exits (told through the
        store; not ``tell``: the store is lost, so the agents' processes are stopped)."""

    @abc.abstractmethod
    def stop_following(self) -> None:
        """Stop following the agents' records and reports (the driver is done)."""


class NoAgents(AgentService):
    """The agents of a job that runs none: nothing to adopt, follow, retire or close."""

    def adopt(self, kvs: Sequence[KeyValue]) -> Mapping[str, WorkerProcess]:
        return {}

    def attach(self, wiring: AgentWiring) -> None:
        pass

    def live_hosts(self) -> frozenset[str]:
        return frozenset()

    def node_hosts(self) -> frozenset[str]:
        return frozenset()

    def busy_hosts(self) -> frozenset[str]:
        return frozenset()

    def lost_hosts(self) -> frozenset[str]:
        return frozenset()

    def retire(self, host: str) -> None:
        pass

    def ready_hosts(self, hosts: Sequence[str]) -> frozenset[str]:
        return frozenset(hosts)

    def prepare(self, host: str) -> None:
        pass

    def close(self, tell: bool = True) -> None:
        pass

    def stop_following(self) -> None:
        pass
