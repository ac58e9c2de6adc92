"""The rules' decisions about hosts carried out, and the discovery's news taken in: a
failure counted against a host (``driver.hosts.manager``: its strikes, its cooldown), a
host lost or probed, an agent retired or prepared (``driver.launch.assignments``), the hosts
a discovery found or why it failed.

``HostActions`` is given what it uses: the job's state (its book), the host manager, the
agents, the event sink, the clock and ``post`` (a probe's answer comes back to the loop
as a message). Each action returns the decisions it leads to, for the loop
(``driver.job.loop``) to carry out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

from driver import events as ev
from driver.hosts.manager import HostManager
from driver.hosts.probe import probe
from driver.job import messages as msg
from driver.job.state import JobState
from driver.launch.assignments.service import AgentService
from driver.policy import decisions as dec
from driver.policy.exits import count_failure
from driver.policy.occupancy import agents_to_retire
from driver.policy.reports import discovery_failed, discovery_succeeded
from driver.threads import spawn

Decisions = Sequence[dec.Decision]


class HostActions:
    """What the loop does to the job's hosts and their agents."""

    def __init__(
        self,
        state: JobState,
        hosts: HostManager,
        agents: AgentService,
        events: ev.EventSink,
        clock: Callable[[], float],
        post: Callable[[msg.Message], None],
    ):
        self._state = state
        self._hosts = hosts
        self._agents = agents
        self._events = events
        self._clock = clock
        self._post = post

    def emit(self, host_events: Sequence[ev.HostEvent]) -> None:
        """Say what the host manager did; the rules look again when it did anything."""
        for host_event in host_events:
            self._events.emit(host_event)
        if host_events:
            self._state.book = self._state.book.changed(self._clock())

    def count_failure(self, decision: dec.CountFailure) -> Decisions:
        """A strike against the failed worker's host, and (``decision.streak``) one more
        failure in the job's streak (``driver.policy.exits.count_failure``)."""
        self.emit(self._hosts.record_failure(decision.host, self._clock()))
        slots = self._hosts.available_slots
        if not decision.streak:
            return ()
        return self._state.take(
            count_failure(self._state.book, slots, decision.code, decision.reason)
        )

    def host_lost(self, decision: dec.HostLost) -> Decisions:
        self.emit(self._hosts.host_lost(decision.host, self._clock()))
        return ()

    def probe(self, decision: dec.Probe) -> Decisions:
        """Ask whether the host answers, in a helper thread (``ProbeAnswered``)."""

        def ask() -> None:
            result = probe(decision.address)
            self._post(msg.ProbeAnswered(decision.host, result.reachable, result.detail))

        spawn(f"probe-{decision.host}", ask)
        return ()

    def retire_agent(self, decision: dec.RetireAgent) -> Decisions:
        self._agents.retire(decision.host)
        return ()

    def prepare_host(self, decision: dec.PrepareHost) -> Decisions:
        self._agents.prepare(decision.host)
        return ()

    def agents_to_retire(self, view: dec.HostsView) -> Decisions:
        """The agents of hosts the job no longer lists, to retire (the rule:
        ``driver.policy.occupancy.agents_to_retire``)."""
        # A joined node's agent is the node's own, and its record is what lists the host:
        # one that discovery has not read yet is no removed host's.
        agents = self._agents.live_hosts() - self._agents.node_hosts()
        busy = self._agents.busy_hosts()
        return agents_to_retire(agents, busy, self._state.workers, view)

    def hosts_found(self, message: msg.HostsFound) -> Decisions:
        """A discovery's hosts: the host manager updated (hosts added, removed)."""
        self._state.book = discovery_succeeded(self._state.book)
        self.emit(self._hosts.update(message.hosts, self._clock()))
        return ()

    def discovery_failed(self, message: msg.DiscoveryFailed) -> Decisions:
        step = discovery_failed(self._state.book, message.error, self._clock())
        self._state.book = step.book
        return step.decisions
