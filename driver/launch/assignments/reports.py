"""What the per-host agents tell the driver (``driver.launch.assignments.launcher``):
their records and their processes' reports, as the store's watches bring them.

* an agent's record written: the agent is up (``on_host_ready`` once); a joined node's
  agent is taken as the node's own; an agent back after its host was taken as lost is
  asked to exit;
* an agent's record gone (its lease lapsed: the agent died or was cut off): its host is
  lost at once, ``on_host_lost(host, detail)`` first, then every process of that host is
  taken as SIGKILLed and the host's assignments are withdrawn (deleted: a later agent
  there must not run them again). Unless the store was in trouble just before
  (``AgentWiring.store_trouble``): the agent then has ``RETURN_GRACE`` seconds to
  register again. A retiring agent's end, or any while the job ends, is no loss;
* a process's status: its pid once started, its code once it exited, which ends its
  handle's ``wait``.

Why apart from the launcher: the launcher writes (assignments, their ``want``, the
job's end); these read, on the watches' threads, and share with it only its book
(``AgentBook``) and its fenced write (``steer_ops``).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Sequence
from typing import Callable

from driver.errors import LeadershipLost
from driver.launch.assignments.book import AgentBook
from driver.launch.assignments.handle import AgentProcess, reap_agent
from driver.launch.assignments.service import AgentWiring
from driver.threads import spawn
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.schema.agents import AGENT_LEASE_TTL, RETURN_GRACE, AgentRecord, ProcessStatus
from rendezvous.store import PUT, Delete, Event, KeyValue, Put

log = logging.getLogger(__name__)


class AgentReports:
    """The agents' news for the launcher whose ``book`` it keeps, in job ``keys``;
    ``wiring`` says whom to tell (``on_host_lost``, ``on_host_ready``) and whether the
    store was in trouble (``store_trouble``); ``steer_ops`` is the launcher's fenced
    write; ``joined``: nodes bring their own agents; ``unfollow``: the driver is done."""

    def __init__(
        self,
        book: AgentBook,
        keys: JobKeys,
        wiring: AgentWiring,
        steer_ops: Callable[[Sequence[Put | Delete]], None],
        joined: bool,
        unfollow: threading.Event,
    ):
        self._book = book
        self._keys = keys
        self._on_host_lost = wiring.on_host_lost
        self._on_host_ready = wiring.on_host_ready
        self._store_trouble = wiring.store_trouble
        self._steer_ops = steer_ops
        self._joined = joined
        self._unfollow = unfollow

    def agent_event(self, event: Event) -> None:
        host = event.key[len(self._keys.agents) :]
        if event.type == PUT:
            self.agent_registered(event.kv)
        else:
            self._agent_gone(host)

    def agents_resync(self, kvs: Sequence[KeyValue]) -> None:
        present = set()
        for kv in kvs:
            present.add(kv.key[len(self._keys.agents) :])
            self.agent_registered(kv)
        with self._book.lock:
            hosts = [
                h for h, a in self._book.agents.items() if a.registered.is_set() and not a.lost
            ]
        for host in hosts:
            if host not in present:
                self._agent_gone(host)

    def agent_registered(self, kv: KeyValue) -> None:
        try:
            record = AgentRecord.from_json(kv.value)
        except (ValueError, TypeError) as exc:
            log.warning("unreadable agent record %s: %s", kv.key, exc)
            return
        with self._book.lock:
            agent = self._book.agents.get(record.host)
            if self._joined and record.slots and (agent is None or not agent.alive):
                # A node that joined (``elastic-run --join``) brings its own agent.
                agent = self._book.agents[record.host] = AgentProcess(
                    record.host, record.agent_id, None
                )
                agent.joined = True
        if agent is not None and agent.agent_id == record.agent_id and agent.lost:
            # Back after its host was taken as lost (its processes' exits taken, its
            # assignments withdrawn): nothing of the job is its any more.
            log.warning(
                "the agent of lost host %s registered again: asking it to exit", record.host
            )
            spawn(f"agent-unwanted-{record.host}", self._retire_lost, record.host, agent.agent_id)
            return
        if agent is not None and agent.agent_id == record.agent_id:
            if agent.lapsed.is_set():
                agent.lapsed.clear()
                agent.returned.set()
                log.warning("the agent of %s registered again: its host goes on", record.host)
            agent.retiring = agent.retiring or record.draining  # its end: no host lost
            first = not agent.registered.is_set()
            agent.registered.set()
            if first and agent.alive:
                self._on_host_ready(record.host)

    def _agent_gone(self, host: str, waited: bool = False) -> None:
        """The agent of ``host`` lost its record: the host is lost (unless the job is
        ending, when agents leave on purpose). Unless the store was in trouble just
        before (``AgentWiring.store_trouble``): every lease lapses when a stalled store
        answers again, so the agent has ``RETURN_GRACE`` seconds to register
        again (``_await_return``; ``waited``: that time is up)."""
        with self._book.lock:
            agent = self._book.agents.get(host)
            if agent is None or agent.lost or not agent.registered.is_set() or self._book.closing:
                return
            if not waited and not agent.retiring and self._store_trouble():
                if agent.lapsed.is_set():
                    return  # (waited on already)
                agent.lapsed.set()
                agent.returned.clear()
                spawn(f"agent-return-{host}", self._await_return, agent)
                log.warning(
                    "the agent of %s lost its lease while the store was away: waiting up "
                    "to %gs for it to register again",
                    host,
                    RETURN_GRACE,
                )
                return
            handles = [
                h
                for pid, h in self._book.handles.items()
                if self._book.hosts_of.get(pid) == host and h.returncode is None
            ]
            if agent.retiring and not handles:  # it left as asked (or drained): no loss
                del self._book.agents[host]
                if agent.process is not None:
                    spawn(f"agent-retired-{host}", reap_agent, agent.process)
                return
            agent.lost = True
            withdrawn = [pid for pid, h in self._book.hosts_of.items() if h == host]
            for process_id in withdrawn:
                self._book.assignments.pop(process_id, None)
        detail = (
            f"its agent's lease lapsed while the store was away and it did not register "
            f"again within {RETURN_GRACE:g}s"
            if waited
            else f"its agent's lease lapsed (no word from it for {AGENT_LEASE_TTL:g}s)"
        )
        self._on_host_lost(host, detail)  # first: the job drops the host, then the exits
        for handle in handles:
            handle.ended(-signal.SIGKILL, presumed=True)
        # Off this thread: a slow store must not hold back the next agent's news. A
        # fresh agent there comes after the host's cooldown, long after this write.
        spawn(f"withdraw-{host}", self.withdraw, host, withdrawn)
        if agent.process is not None:
            spawn(f"agent-lost-{host}", agent.process.kill)

    def _await_return(self, agent: AgentProcess) -> None:
        """Wait for ``agent``, whose lease lapsed while the store was in trouble, to
        register again: ``RETURN_GRACE`` seconds counted from when the store is
        out of trouble; then, unless it did, or the job ends, its host is lost."""
        deadline = time.monotonic() + RETURN_GRACE
        while not agent.returned.wait(max(0.0, deadline - time.monotonic())):
            if self._unfollow.is_set():
                return
            if self._store_trouble():  # still away: it cannot register yet
                deadline = time.monotonic() + RETURN_GRACE
                continue
            with self._book.lock:
                if self._book.agents.get(agent.host) is not agent:
                    return  # (replaced meanwhile)
            self._agent_gone(agent.host, waited=True)
            return

    def withdraw(self, host: str, process_ids: Sequence[str]) -> None:
        """Delete the assignments of a lost host's processes: they are dead to the
        job (their exits were taken), and the next agent on that host (once it is
        back) reads the host's assignments as what to run. Left in place, it would
        start them again: a stale worker, or a second copy of a ps shard that already
        serves elsewhere writing checkpoints into the same directory. Their old agent,
        should it hear from the store again, stops what it runs for them."""
        if not process_ids:
            return
        try:
            self._steer_ops([Delete(self._keys.assignment(host, p)) for p in process_ids])
        except (RendezvousError, LeadershipLost) as exc:
            log.warning("cannot withdraw the assignments of lost host %s: %s", host, exc)

    def status_event(self, event: Event) -> None:
        if event.type == PUT:
            self.take_status(event.value)

    def statuses_resync(self, kvs: Sequence[KeyValue]) -> None:
        for kv in kvs:
            self.take_status(kv.value)

    def take_status(self, value: bytes) -> None:
        try:
            status = ProcessStatus.from_json(value)
        except (ValueError, TypeError) as exc:
            log.warning("unreadable process status: %s", exc)
            return
        with self._book.lock:
            handle = self._book.handles.get(status.id)
        if handle is None:
            return
        if status.exited:
            handle.ended(
                status.code if status.code is not None else -1, status.error, status.permanent
            )
        else:
            handle.started(status.pid)

    def _retire_lost(self, host: str, agent_id: str) -> None:
        try:
            self._steer_ops([Put(self._keys.retire(host), agent_id.encode())])
        except (RendezvousError, LeadershipLost) as exc:
            log.warning("cannot ask the agent of lost host %s to exit: %s", host, exc)
