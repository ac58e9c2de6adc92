"""The driver's side of the per-host agents (``driver.agent``): start one per host,
hand it processes through the store, learn their exits from its reports.

``AgentLauncher`` is a ``Launcher``: the job's process bookkeeping
(``driver.job.processes``) and the ps supervisor launch through it as through any
launcher, and get back an ``AssignedProcess``, a handle whose ``wait``, ``stop`` and
``kill`` go through the store:

* ``launch(spec)`` makes sure ``spec.host`` has a live agent (starting one with the
  ``starter``: ssh, or a local process; in join mode, ``joined``, each node brought its
  own, and the hosts of -H or a script beside them are started), writes an ``Assignment`` (the leader's term, not the job's secret) and waits for
  the agent's first ``ProcessStatus``: a pid, or why it did not start (``LaunchError``);
* ``stop``/``kill`` rewrite the assignment with ``want`` "stop"/"kill"; the agent does
  it and reports the exit, which ends the handle's ``wait``;
* an agent whose record vanishes (its lease lapsed: the agent died or was cut off)
  makes its host lost at once: ``on_host_lost(host, detail)`` is called first (the job
  drops the host, as when a probe finds a host unreachable), then every process of
  that host is taken as SIGKILLed and the host's assignments are withdrawn (deleted: a
  later agent there must not run them again);
* ``retire(host)``: the job's rule found the host removed by discovery and idle: write
  ``JobKeys.retire(host)`` naming its agent, which exits; its record's end is then no
  lost host (a later agent there, with another id, is not touched);
* ``close``: write ``JobKeys.ended`` (agents stop what they run and exit) and wait for
  the agents' own processes.
* Every write (assignments, their ``want``, ``ended``) goes through ``_steer``: the
  leader's fenced write (``driver.leadership.claim``) when ``attach`` was given one, so a driver
  that lost the lead writes nothing.
* ``adopt``: a driver taking a job over takes its live agents (from their records)
  and the processes they run (from the assignments and process records) as its own:
  a handle per running process, signalled and followed through the store as if this
  driver had launched it; the assignments of a host with no live agent are withdrawn
  (as for a host lost now).

What the agents tell it (their records, their processes' reports) is read by
``driver.launch.assignments.reports`` on the watches' threads; both keep one book of
the agents and their processes (``driver.launch.assignments.book``).

Which hosts go through agents is ``uses_agent``: with etcd every host (the job must
outlive its driver, so no process may be the driver's child); with the embedded store
the ssh hosts, while this machine's processes stay the driver's children (the driver is
the store: its death ends the job anyway, and one machine keeps its speed).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Callable

from driver.errors import LauncherError, LaunchError, LeadershipLost
from driver.launch.assignments.assigned import AssignedProcess
from driver.launch.assignments.book import AgentBook
from driver.launch.assignments.handle import AgentProcess, agent_command, reap_agent
from driver.launch.assignments.reports import AgentReports
from driver.launch.assignments.service import AgentService, AgentStarts, AgentWiring
from driver.launch.assignments.snapshot import read_agent_keys
from driver.launch.base import Launcher
from driver.launch.output import PrefixFn, Stream
from driver.launch.process import REAP_TIMEOUT, STOP_GRACE, WorkerProcess
from driver.launch.spec import LaunchSpec
from driver.threads import spawn
from rendezvous import env
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.schema.agents import (
    Assignment,
)
from rendezvous.store import Delete, KeyValue, KVStore, Put
from rendezvous.watch import follow_in_thread

log = logging.getLogger(__name__)

AGENT_START_TIMEOUT = 30.0
"""Seconds a new agent has to register (ssh connection and Python's start included)."""

PROCESS_START_TIMEOUT = 30.0
"""Seconds an agent has to report a process it was assigned as started (or failed)."""


class AgentLauncher(Launcher, AgentService):
    """The ``AgentService`` of ``elastic-run``: through agents (started by ``starter``;
    ``joined``: the nodes' own) for the hosts ``use_agent`` picks, else ``direct``, which
    it uses for all until ``attach`` gives it the store and the agents' variables."""

    name = "agents"

    def __init__(
        self,
        starter: Launcher,
        direct: Launcher,
        starts: AgentStarts,
        *,
        use_agent: Callable[[str], bool],
        out: Stream | None = None,
        err: Stream | None = None,
    ):
        super().__init__(out, err)
        self._starter = starter
        self._direct = direct
        self._agent_env: dict[str, str] = {}
        self._starts = starts
        self._use_agent = use_agent
        self._joined = starts.joined
        self._book = AgentBook()
        self._reports: AgentReports | None = None  # made by ``attach``
        self._store: KVStore | None = None
        self._keys = JobKeys(starts.job_id)
        self._term: Callable[[], int] = lambda: 1
        self._on_host_lost: Callable[[str, str], None] = lambda host, detail: None
        self._preparing: set[str] = set()  # hosts whose agent ``prepare`` is starting
        self._shards = 0
        self._following = False
        # Its own stop, set by ``stop_following``: the exits of what the job's end stops
        # come through these watches, after the job's loop and its feeds have stopped.
        self._unfollow = threading.Event()
        self._patience = 0.0
        self._fenced: Callable[[Sequence[Put | Delete]], int] | None = None
        self._agentless: dict[str, list[str]] = {}  # adopted assignments of agentless hosts

    def attach(self, wiring: AgentWiring) -> None:
        """Use the job's store from now on (``AgentWiring``: ``leader.term()``, the
        leader's term for assignments; ``leader.steer``, its fenced write); follow the agents' records and
        process reports until ``stop_following`` (after ``close``: the exits of what the
        job's end stops are reports too), from the first launch through an agent on (a
        job with no agent watches nothing more), or at once when agents were adopted or
        join. The adopted assignments of agentless hosts are withdrawn
        (``AgentReports.withdraw``).
        """
        self._store, leader = wiring.store, wiring.leader
        if leader is not None:
            self._term, self._fenced = leader.term, leader.steer
        self._on_host_lost = wiring.on_host_lost
        self._agent_env = dict(wiring.agent_env)
        self._patience = wiring.patience
        self._reports = reports = AgentReports(
            self._book, self._keys, wiring, self._steer_ops, self._joined, self._unfollow
        )
        with self._book.lock:
            if self._book.agents or self._joined:
                self._start_following()
            agentless, self._agentless = self._agentless, {}
        for host, process_ids in sorted(agentless.items()):
            reports.withdraw(host, process_ids)

    def adopt(self, kvs: Sequence[KeyValue]) -> dict[str, AssignedProcess]:
        """Take over the agents and the processes of a job a predecessor led, from its
        keys ``kvs`` (read at one revision): the live agents (their records), and a
        handle for each assigned process that an agent reports running, by process id
        (before ``attach``: its feeds then carry their later reports)."""
        agents, assignments, statuses = read_agent_keys(self._keys, kvs)
        handles: dict[str, AssignedProcess] = {}
        with self._book.lock:
            for host, record in agents.items():
                agent = AgentProcess(host, record.agent_id, None)
                agent.joined = record.slots > 0
                agent.registered.set()
                self._book.agents[host] = agent
            for process_id, (host, assignment) in assignments.items():
                # Known by host even when not running: withdrawn with the host if lost.
                self._book.hosts_of[process_id] = host
                if host not in agents:  # lost before the takeover: withdrawn at attach
                    self._agentless.setdefault(host, []).append(process_id)
                reported = statuses.get(process_id)
                if reported is None or reported.exited or host not in agents:
                    continue
                spec = LaunchSpec(
                    host=host,
                    slot=assignment.slot,
                    command=assignment.command,
                    env=dict(assignment.env),
                    cwd=assignment.cwd or None,
                    label=assignment.label or f"{host}:{assignment.slot}",
                    log_path=assignment.log_path or None,
                )
                handle = AssignedProcess(spec, process_id, self._want)
                handle.started(reported.pid)
                self._book.handles[process_id] = handles[process_id] = handle
                self._book.assignments[process_id] = assignment
                if assignment.kind == "shard":
                    self._shards += 1
        return handles

    def _start_following(self) -> None:
        """Follow the agents' records and the process reports (once; under the lock)."""
        reports = self._reports
        if self._following or self._store is None or reports is None:
            return
        self._following = True
        for prefix, on_event, on_resync in (
            (self._keys.agents, reports.agent_event, reports.agents_resync),
            (self._keys.processes, reports.status_event, reports.statuses_resync),
        ):
            follow_in_thread(
                f"follow-{prefix}",
                self._store,
                prefix,
                on_event=on_event,
                on_resync=on_resync,
                on_lost=lambda exc: None,  # the job's own feeds say the store is lost
                stop=self._unfollow,
                patience=self._patience,
            )

    def live_hosts(self) -> frozenset[str]:
        """Hosts with a registered agent that is neither lost nor retiring."""
        with self._book.lock:
            return frozenset(h for h, a in self._book.agents.items() if a.alive)

    def node_hosts(self) -> frozenset[str]:
        """Of ``live_hosts``, the joined nodes'."""
        with self._book.lock:
            return frozenset(h for h, a in self._book.agents.items() if a.alive and a.joined)

    def busy_hosts(self) -> frozenset[str]:
        """Hosts where a process assigned through an agent has not been reported ended."""
        with self._book.lock:
            return frozenset(
                self._book.hosts_of[p]
                for p, h in self._book.handles.items()
                if h.returncode is None
            )

    def ready_hosts(self, hosts: Sequence[str]) -> frozenset[str]:
        """See ``AgentService.ready_hosts``."""
        with self._book.lock:  # live and registered: one still starting takes nothing yet
            up = {h for h, a in self._book.agents.items() if a.alive and a.registered.is_set()}
        return frozenset(
            h for h in hosts if self._store is None or not self._use_agent(h) or h in up
        )

    def prepare(self, host: str) -> None:
        """See ``AgentService.prepare``."""
        if self._store is None or not self._use_agent(host):
            return
        with self._book.lock:
            agent = self._book.agents.get(host)
            if host in self._preparing or (agent is not None and agent.alive):
                return
            self._preparing.add(host)

        def start() -> None:
            try:
                self._ensure_agent(host)
            except (LauncherError, RendezvousError) as exc:
                self._on_host_lost(host, f"its agent cannot start: {exc}")
            except LeadershipLost:
                pass  # this driver steers nothing more: the loop learns it on its own
            finally:
                with self._book.lock:
                    self._preparing.discard(host)

        spawn(f"agent-prepare-{host}", start)

    def retire(self, host: str) -> None:
        """Ask the agent of ``host`` to exit (``JobKeys.retire`` names it, through the
        fenced write: the same route for an agent a predecessor started); its record's
        end is then no lost host."""
        with self._book.lock:
            agent = self._book.agents.get(host)
            if agent is None or not agent.alive:
                return
            agent.retiring = True
        try:
            self._steer(self._keys.retire(host), agent.agent_id.encode())
        except (RendezvousError, LeadershipLost) as exc:
            agent.retiring = False  # asked again at the next reconcile
            log.warning("cannot ask the agent of removed host %s to exit: %s", host, exc)

    def lost_hosts(self) -> frozenset[str]:
        """Hosts whose agent was lost (until a new agent is started there)."""
        with self._book.lock:
            return frozenset(h for h, a in self._book.agents.items() if a.lost)

    # ------------------------------------------------------------------ launching
    def launch(self, spec: LaunchSpec, prefix: PrefixFn | None = None) -> WorkerProcess:
        """See ``Launcher.launch``.

        Raises:
            LaunchError: the host's agent cannot be started, or it could not start the
                process (``permanent`` as the agent says).
        """
        if self._store is None or not self._use_agent(spec.host):
            return self._direct.launch(spec, prefix)
        self._ensure_agent(spec.host)
        worker_id = spec.env.get(env.ENV_WORKER_ID)
        if worker_id is None:
            with self._book.lock:
                self._shards += 1
                process_id = f"{spec.label}-{self._shards}"
        else:
            process_id = worker_id
        assignment = Assignment(
            id=process_id,
            kind="worker" if worker_id is not None else "shard",
            slot=spec.slot,
            command=tuple(spec.command),
            term=self._term(),
            env={k: v for k, v in spec.env.items() if k != env.ENV_SECRET},
            cwd=spec.cwd or os.getcwd(),
            label=spec.label,
            log_path=spec.log_path or "",
        )
        handle = AssignedProcess(spec, process_id, self._want)
        with self._book.lock:
            self._book.handles[process_id] = handle
            self._book.hosts_of[process_id] = spec.host
            self._book.assignments[process_id] = assignment
        try:
            self._steer(self._keys.assignment(spec.host, process_id), assignment.to_json())
        except RendezvousError as exc:
            raise LaunchError(f"cannot assign {spec.label} to its agent: {exc}") from exc
        if not handle.wait_reported(PROCESS_START_TIMEOUT):
            handle.kill()
            raise LaunchError(
                f"the agent of {spec.host} did not start {spec.label} "
                f"within {PROCESS_START_TIMEOUT:g}s"
            )
        if not handle.pid and handle.error:
            raise LaunchError(handle.error, permanent=handle.permanent)
        return handle

    def _steer(self, key: str, value: bytes) -> None:
        """Write ``value`` under ``key`` for the agents (``_steer_ops``).

        Raises:
            RendezvousError: the store cannot be used.
        """
        self._steer_ops([Put(key, value)])

    def _steer_ops(self, ops: Sequence[Put | Delete]) -> None:
        """Every write of the leader to the agents (assignments, their withdrawal, the
        job's end) goes through here: the one place to fence them with the leader's
        claim.

        Raises:
            RendezvousError: the store cannot be used.
        """
        if self._store is None:
            raise RendezvousError("the agents' store is not attached")
        if self._fenced is not None:
            self._fenced(ops)  # LeadershipLost: another driver leads
        else:
            self._store.txn([], ops)

    def _want(self, process_id: str, want: str, grace: float) -> None:
        """Rewrite the assignment of ``process_id`` to ``want`` (stop with ``grace``,
        kill)."""
        with self._book.lock:
            assignment = self._book.assignments.get(process_id)
            host = self._book.hosts_of.get(process_id)
        if assignment is None or host is None or self._store is None:
            return
        changed = replace(assignment, want=want, grace=grace or assignment.grace, term=self._term())
        with self._book.lock:
            self._book.assignments[process_id] = changed
        try:
            self._steer(self._keys.assignment(host, process_id), changed.to_json())
        except (RendezvousError, LeadershipLost) as exc:
            log.warning("cannot ask the agent of %s to %s %s: %s", host, want, process_id, exc)

    def _ensure_agent(self, host: str) -> None:
        """Start the agent of ``host`` unless a live one is there.

        Raises:
            LaunchError: it cannot be started or does not register in time.
        """
        if self._joined and self._node_agent(host):
            return
        if not self._starts.starts_agents:
            raise LaunchError(f"{host} has no agent: its node left the job")
        with self._book.lock:
            self._start_following()
            agent = self._book.agents.get(host)
            if agent is not None and agent.alive:
                return
            if agent is not None and agent.retiring and agent.process is not None:
                spawn(f"agent-retired-{host}", reap_agent, agent.process)  # the host is back
            agent_id = uuid.uuid4().hex[:12]
            command = agent_command(
                self._keys.job_id,
                host,
                agent_id,
                self._starts.driver_timeout,
                self._starts.detach,
            )
            spec = LaunchSpec(
                host=host,
                slot=0,
                command=command,
                env=self._agent_env,
                cwd=os.getcwd(),
                label=f"agent@{host}",
            )
            process = self._starter.launch(spec, prefix=lambda: "")
            agent = self._book.agents[host] = AgentProcess(host, agent_id, process)
        deadline = time.monotonic() + AGENT_START_TIMEOUT
        while not agent.registered.wait(0.1):
            assert agent.process is not None  # (an agent this driver started)
            code = agent.process.poll()
            if code is not None:
                raise LaunchError(f"the agent of {host} exited with {code} before it registered")
            if time.monotonic() > deadline:
                agent.process.kill()
                raise LaunchError(
                    f"the agent of {host} did not register within {AGENT_START_TIMEOUT:g}s"
                )

    def _node_agent(self, host: str) -> bool:
        """Whether ``host`` has a live agent: a joined node's, read from the store when
        the watch has not brought its record yet."""
        agent = self._book.agents.get(host)
        if not (agent and agent.alive) and self._store is not None and self._reports:
            if (kv := self._store.get(self._keys.agent(host))) is not None:
                self._reports.agent_registered(kv)
            agent = self._book.agents.get(host)
        return agent is not None and agent.alive

    # ------------------------------------------------------------------ the end
    def stop_following(self) -> None:
        """Stop the watches of the agents' records and reports (the driver is done)."""
        self._unfollow.set()

    def close(self, tell: bool = True, timeout: float = STOP_GRACE + REAP_TIMEOUT) -> None:
        """The job is over: say so (``JobKeys.ended``: every agent stops what it runs
        and exits) and wait up to ``timeout`` for the agents' processes; stop those
        still running. Not ``tell``: the store is lost, so the agents' processes are
        stopped at once (SIGTERM, SIGKILL after the grace: their workers go with them)."""
        with self._book.lock:
            self._book.closing = True
            agents = list(self._book.agents.values())
        if not agents:
            return
        if not tell:
            timeout = 0.0
        elif self._store is not None:
            try:
                self._steer(self._keys.ended, b"1")
            except (RendezvousError, LeadershipLost) as exc:
                log.warning("cannot tell the agents the job is over: %s", exc)
        deadline = time.monotonic() + timeout
        for agent in agents:
            if agent.process is None:
                continue  # a predecessor's agent: it leaves on the job's end by itself
            if agent.process.wait(max(0.0, deadline - time.monotonic())) is None:
                agent.process.stop(STOP_GRACE)
