"""The agent of one host: registers, follows what the leader assigns, runs it, reports.

One thread (``Agent.run``) owns the state: the host's assignments, the process table
(``driver.agent.table``) and the view of the leadership (``driver.agent.rules``).
Other threads only post to its queue: the store feeds (``driver.agent.feeds``: the
host's assignments, the leader record, the round, the job's end, its retirement; each
through ``rendezvous.watch.follow_prefix``), the process waiters, a signal. After each burst of
news the loop asks ``rules.reconcile`` what to do and does it: start a process with the
process layer (``driver.launch``: own process group, pidfd wait, stop with a grace),
stop or kill one, write its ``ProcessStatus`` when it starts and when it ends.

The agent's record (``AgentRecord`` under ``JobKeys.agent(host)``) lives under the
agent's own short lease (``AGENT_LEASE_TTL``), refreshed by a thread: when the agent
dies, or is cut off, the record lapses within seconds and the driver takes the host as
lost. An agent that finds its lease gone (it was cut off) stops everything and ends: the
driver gave up on it and starts a fresh agent when it wants the host again.

The workers it starts register and learn their rounds through it
(``driver.agent.workers``: a Unix socket whose path they find in
``ELASTIC_AGENT_SOCKET``): their registrations live under the agent's lease, and the
round it follows is forwarded to them, so the store holds one lease and one watch per
host.

Output of the processes is forwarded, prefixed ``[rank]`` (the agent follows the round
key for ranks) or ``[host:slot]`` before a rank, to the streams the launcher was given
(``driver.agent.output.Tee``: stdout and the per-host log file).
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from dataclasses import replace
from typing import Callable

from driver.agent import news, rules
from driver.agent.feeds import RETIRED, follow_store
from driver.agent.folders import CheckpointFolders
from driver.agent.rules import AgentView, ProcState
from driver.agent.settings import AgentIdentity, AgentTimings
from driver.agent.table import ProcessTable, TableEntry
from driver.agent.workers import WorkerChannel, store_registrations
from driver.errors import LauncherError, LaunchError
from driver.launch.base import Launcher
from driver.launch.process import WorkerProcess, stop_all
from driver.launch.spec import LaunchSpec
from driver.threads import spawn
from rendezvous import env
from rendezvous.errors import LeaseNotFoundError, RendezvousError
from rendezvous.host_plan import RoundView
from rendezvous.keys import JobKeys
from rendezvous.retry import Backoff
from rendezvous.schema.agents import AgentRecord, Assignment, ProcessStatus, leader_term
from rendezvous.store import Compare, KVStore, Lease, Put

log = logging.getLogger(__name__)

TICK = 1.0
"""Longest wait between two reconciles (the driver timeout is checked then)."""


DRAINED = "preempted; its processes were stopped"
"""Why a drained agent (SIGTERM) ends once its processes left."""


DRAIN_GRACE = 25.0
"""Seconds a preempted agent keeps its processes for the job to snapshot their state
and stop them, before it stops them itself (within Kubernetes' 30 s default grace)."""


class Agent:
    """The agent ``identity`` (its host, its id) in job ``keys``. ``launcher`` starts the
    processes on this machine (a ``LocalLauncher`` whose output goes where the agent's
    goes); ``timings``: how long it waits for a leader, a process, its lease;
    ``clock``: the monotonic time."""

    def __init__(
        self,
        store: KVStore,
        keys: JobKeys,
        identity: AgentIdentity,
        *,
        launcher: Launcher,
        timings: AgentTimings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.host = identity.host
        self._identity = identity
        self._store = store
        self._keys = keys
        self._launcher = launcher
        self._timings = timings or AgentTimings()
        self._clock = clock
        self._queue: queue.Queue[news.News] = queue.Queue()
        self._done = threading.Event()  # the feeds and the lease thread end
        self._store_away = threading.Event()  # the lease could not be refreshed for a TTL
        self._assignments: dict[str, Assignment] = {}
        self._folders = CheckpointFolders(self.host)  # what its workers snapshot into
        self._table = ProcessTable()
        self._view = AgentView()
        self._plan: RoundView | None = None  # the newest round, as this host reads it
        self._lease: Lease | None = None
        self._channel = WorkerChannel(*store_registrations(store, keys, lambda: self._lease))
        self._channel_path = ""  # where its workers reach the channel ("": not open)
        self._started = time.time()
        self._drain_until: float | None = None  # preempted: ends by then at the latest

    # ------------------------------------------------------------------ the run
    def request_shutdown(self, reason: str) -> None:
        """Stop every process and end ``run`` (thread-safe; from a signal handler too)."""
        self._queue.put(news.ShutdownAsked(reason))

    def request_drain(self, reason: str) -> None:
        """The scheduler takes this host back (SIGTERM): tell the job
        (``JobKeys.preempted``), which has a snapshot written and then stops this
        host's processes; end ``run`` once none runs, or after ``DRAIN_GRACE``. A
        second request ends it at once (thread-safe; from a signal handler too)."""
        self._queue.put(news.ShutdownAsked(reason, drain=True))

    def run(self) -> str:
        """Register, follow the store, run what is assigned until told to stop or the
        driver is gone for ``driver_timeout``; stop every process, unregister. Returns
        why it ended.

        Raises:
            RendezvousError: the store cannot be used to register.
        """
        self._register()
        try:
            self._open_channel()
            self._follow()
            while True:
                reason = self._turn()
                if reason is not None:
                    # An ordinary end is no warning: every healthy run would end with one.
                    quiet = reason in (rules.JOB_OVER, RETIRED, DRAINED)
                    log.log(
                        logging.INFO if quiet else logging.WARNING,
                        "agent of %s stops: %s",
                        self.host,
                        reason,
                    )
                    return reason
        finally:
            self._done.set()
            self._stop_everything()
            self._channel.close()
            self._unregister()

    def _open_channel(self) -> None:
        """Open the workers' channel; without one (no socket could be made) they are
        the store's clients themselves, as without an agent."""
        try:
            self._channel_path = self._channel.start()
        except OSError as exc:
            log.warning("agent of %s: its workers register themselves: %s", self.host, exc)

    def _turn(self) -> str | None:
        """Wait for news (up to ``TICK``), take every piece that came, reconcile."""
        try:
            arrived = [self._queue.get(timeout=TICK)]
        except queue.Empty:
            arrived = []
        while True:
            try:
                arrived.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for item in arrived:
            if isinstance(item, news.ShutdownAsked):
                if item.drain and self._drain_until is not None:
                    continue  # draining already (a process group's SIGTERM, and a forwarded one)
                if not item.drain or not self._table.alive():
                    return item.reason
                self._start_drain(item.reason)
                continue
            self._take(item)
        if self._drain_until is not None and (
            self._clock() >= self._drain_until or not self._table.alive()
        ):
            return DRAINED
        actions, self._view = rules.reconcile(
            self._assignments,
            self._table.states(),
            self._view,
            self._clock(),
            self._timings.driver_timeout,
        )
        for action in actions:
            if isinstance(action, rules.Shutdown):
                return action.reason
            self._act(action)
        return None

    def _start_drain(self, reason: str) -> None:
        """Say the host is preempted; keep its processes for the job to stop."""
        self._drain_until = self._clock() + DRAIN_GRACE
        log.warning(
            "agent of %s preempted (%s): the job snapshots its state, then stops this "
            "host's processes (within %.0fs)",
            self.host,
            reason,
            DRAIN_GRACE,
        )
        try:
            # Under the agent's lease: gone with the agent, so a host that comes back
            # later (a new agent) is not taken for preempted again.
            lease = self._lease.id if self._lease is not None else 0
            self._store.put(self._keys.agent(self.host), self._record(), lease)  # draining
            self._store.put(self._keys.preempted(self.host), self.host.encode(), lease=lease)
        except RendezvousError as exc:
            log.warning("cannot tell the job that %s is preempted: %s", self.host, exc)

    # ------------------------------------------------------------------ news
    def _take(self, item: news.News) -> None:
        if isinstance(item, news.Assigned):
            process_id = item.key[len(self._keys.assignments(self.host)) :]
            if item.value is None:
                self._assignments.pop(process_id, None)
            else:
                self._set_assignment(process_id, item.value)
        elif isinstance(item, news.AssignedAll):
            self._assignments = {}
            prefix = len(self._keys.assignments(self.host))
            for kv in item.kvs:
                self._set_assignment(kv.key[prefix:], kv.value)
        elif isinstance(item, news.LeaderSeen):
            self._view = rules.leader_seen(self._view, item.term, self._clock())
        elif isinstance(item, news.LeaderRecheck):
            try:
                record = self._store.get(self._keys.driver)
            except RendezvousError as exc:
                log.debug("agent of %s: cannot read the leader record: %s", self.host, exc)
                return
            term = leader_term(record.value if record is not None else None)
            self._view = rules.leader_seen(self._view, term, self._clock())
        elif isinstance(item, news.RoundChanged):
            self._take_round(item.view)
        elif isinstance(item, news.Ended):
            self._view = replace(self._view, ended=True)
        elif isinstance(item, news.Exited):
            self._report_exit(item.id, item.code)

    def _set_assignment(self, process_id: str, value: bytes) -> None:
        try:
            self._assignments[process_id] = Assignment.from_json(value)
        except ValueError as exc:
            log.warning("agent of %s: ignoring assignment %s: %s", self.host, process_id, exc)

    def _take_round(self, plan: RoundView) -> None:
        if self._plan is not None and plan.round_id <= self._plan.round_id:
            return
        self._plan = plan
        for entry in self._table.alive():
            member = plan.member(entry.assignment.id)
            if entry.process is not None:
                entry.process.rank = member.rank if member is not None else None

    # ------------------------------------------------------------------ actions
    def _act(self, action: rules.Action) -> None:
        if isinstance(action, rules.Start):
            self._start(action.assignment)
        elif isinstance(action, rules.Stop):
            entry = self._table.get(action.id)
            if entry is not None and entry.process is not None:
                self._table.set_state(action.id, ProcState.STOPPING)
                grace = self._assignments.get(action.id, entry.assignment).grace
                spawn(f"stop-{action.id}", entry.process.stop, grace)
        elif isinstance(action, rules.Kill):
            entry = self._table.get(action.id)
            if entry is not None and entry.process is not None:
                self._table.set_state(action.id, ProcState.KILLED)
                entry.process.kill()
        elif isinstance(action, rules.NeverStarted):
            now = time.time()
            self._table.add(TableEntry(action.assignment, None, ProcState.EXITED, now, None, now))
            self._write_status(action.assignment.id, 0, now, code=-signal.SIGTERM)
        elif isinstance(action, rules.Refuse):
            log.warning(
                "agent of %s: refusing assignment %s of term %d (a leader of term %d exists)",
                self.host,
                action.assignment.id,
                action.assignment.term,
                action.highest_term,
            )

    def _start(self, assignment: Assignment) -> None:
        now = time.time()
        unwritable = self._folders.problem(assignment)
        if unwritable is not None:  # every snapshot of this host would fail: say so now
            log.warning("agent of %s: cannot start %s: %s", self.host, assignment.id, unwritable)
            self._table.add(TableEntry(assignment, None, ProcState.EXITED, now, -1, now))
            self._write_status(assignment.id, 0, now, code=-1, error=unwritable, permanent=True)
            return
        try:
            spec = LaunchSpec(
                host=self.host,
                slot=assignment.slot,
                command=assignment.command,
                env={**assignment.env, env.ENV_AGENT_SOCKET: self._channel_path},
                cwd=assignment.cwd or None,
                label=assignment.label,
                log_path=assignment.log_path or None,
            )
            process = self._launcher.launch(spec)
        except LauncherError as exc:
            permanent = isinstance(exc, LaunchError) and exc.permanent
            log.warning("agent of %s: cannot start %s: %s", self.host, assignment.id, exc)
            self._table.add(TableEntry(assignment, None, ProcState.EXITED, now, -1, now))
            self._write_status(assignment.id, 0, now, code=-1, error=str(exc), permanent=permanent)
            return
        if self._plan is not None:
            member = self._plan.member(assignment.id)
            process.rank = member.rank if member is not None else None
        self._table.add(TableEntry(assignment, process, ProcState.RUNNING, now))
        self._write_status(assignment.id, process.pid, now)
        spawn(f"wait-{assignment.id}", self._wait_exit, assignment.id, process)

    def _wait_exit(self, process_id: str, process: WorkerProcess) -> None:
        code = process.wait(timeout=None)
        self._queue.put(news.Exited(process_id, code if code is not None else -1))

    def _report_exit(self, process_id: str, code: int) -> None:
        entry = self._table.get(process_id)
        if entry is None or entry.state is ProcState.EXITED:
            return
        self._channel.forget(process_id)  # (a child of it may hold its channel open)
        ended = self._table.exited(process_id, code, time.time())
        pid = ended.process.pid if ended.process is not None else 0
        self._write_status(process_id, pid, ended.started, code=code, ended=ended.ended)

    def _write_status(
        self,
        process_id: str,
        pid: int,
        started: float,
        *,
        code: int | None = None,
        ended: float = 0.0,
        error: str = "",
        permanent: bool = False,
    ) -> None:
        status = ProcessStatus(
            id=process_id,
            host=self.host,
            pid=pid,
            state="running" if code is None else "exited",
            started=started,
            term=self._view.highest_term,
            code=code,
            ended=ended,
            error=error,
            permanent=permanent,
        )
        try:
            self._store.put(self._keys.process(self.host, process_id), status.to_json())
        except RendezvousError as exc:
            log.warning("agent of %s: cannot report %s: %s", self.host, process_id, exc)

    def _stop_everything(self) -> None:
        """Stop every process still running (SIGTERM, SIGKILL after the grace, reap) and
        report each exit (best effort: the store may be gone)."""
        alive = self._table.alive()
        stop_all([e.process for e in alive if e.process is not None], self._timings.stop_grace)
        if self._store_away.is_set():
            return  # each report would wait out the store's retry deadline: none is read
        for entry in alive:
            code = entry.process.returncode if entry.process is not None else None
            self._report_exit(entry.assignment.id, code if code is not None else -1)

    # ------------------------------------------------------------------ the store
    def _record(self) -> bytes:
        record = AgentRecord(
            self.host,
            self._identity.pid,
            self._started,
            self._view.highest_term,
            self._identity.log_path,
            self._identity.agent_id,
            self._identity.slots,
            draining=self._drain_until is not None,
        )
        return record.to_json()

    def _register(self) -> None:
        """Write the agent's record under a fresh lease, kept alive by a thread (it
        replaces whatever record is there: the starter wants this agent).

        Raises:
            RendezvousError: the store cannot be used.
        """
        lease = self._store.grant_lease(self._timings.lease_ttl)
        self._store.put(self._keys.agent(self.host), self._record(), lease.id)
        self._lease = lease
        self._keep_alive(lease)

    def _keep_alive(self, lease: Lease) -> None:
        lease.keep_alive(on_lost=self._lease_lost, interval=max(self._timings.lease_ttl / 3.0, 0.2))

    def _lease_lost(self, exc: Exception) -> None:
        """The lease's refresh failed for longer than its TTL. If the store says the
        lease is gone, the driver has taken this host as lost (and will start another
        agent when it wants the host again): stop everything and end. If the store was
        only unreachable (an etcd outage keeps leases), keep refreshing."""
        lease = self._lease
        if not isinstance(exc, LeaseNotFoundError):
            # No leader can be seen while the store cannot: the --driver-timeout clock
            # runs from now (not from when the watches give up).
            self._store_away.set()
            self._queue.put(news.LeaderSeen(None))
        backoff = Backoff(None, initial=0.2, cap=1.0, stop=self._done)
        while lease is not None and not self._done.is_set():
            try:
                lease.refresh()
            except LeaseNotFoundError:
                if self._register_again():
                    return
                self.request_shutdown(f"its lease lapsed ({exc}): the driver took the host as lost")
                return
            except RendezvousError as err:
                log.debug("agent of %s: refreshing its lease failed: %s", self.host, err)
            else:
                self._store_away.clear()
                self._queue.put(news.LeaderRecheck())  # the record may not have changed
                self._keep_alive(lease)  # the same lease, refreshed again
                return
            if not backoff.pause():
                return

    def _register_again(self) -> bool:
        """After the store let the agent's lease lapse (it stalled for longer than the
        TTL, and expired every lease when it answered again), write the agent's record,
        and its workers' registrations, under a new lease: the driver waits for them
        (``rendezvous.schema.agents.RETURN_GRACE``) before it takes the host
        as lost. Only into an empty seat: a record of another agent there means this
        one was replaced. False when it was, or the store cannot be used (the agent
        then ends, as a cut-off agent does).
        """
        key = self._keys.agent(self.host)
        try:
            lease = self._store.grant_lease(self._timings.lease_ttl)
            seat_empty = Compare(key, "create", "==", 0)
            # Not the preemption key of a draining agent: its record says it drains, and
            # an agent cut off, then back, must not mark its host's next agent preempted.
            ops = [Put(key, self._record(), lease.id)]
            if not self._store.txn([seat_empty], ops).succeeded:
                lease.revoke()
                return False
        except RendezvousError as err:
            log.warning("agent of %s: cannot register again: %s", self.host, err)
            return False
        self._lease = lease
        self._store_away.clear()
        self._keep_alive(lease)
        self._channel.register_again()
        self._queue.put(news.LeaderRecheck())
        log.warning(
            "agent of %s: its lease lapsed while the store was away; registered again", self.host
        )
        return True

    def _unregister(self) -> None:
        lease = self._lease
        if lease is None:
            return
        if self._store_away.is_set():
            lease.stop_keep_alive()  # it lapses by itself; a revoke would wait out the store
            return
        try:
            lease.revoke()
        except RendezvousError as exc:
            log.debug("agent of %s: cannot revoke its lease: %s", self.host, exc)

    def _follow(self) -> None:
        """The store's feeds (``driver.agent.feeds``), each in a daemon thread until the
        agent ends; the round goes to the workers at once, not after a turn."""
        follow_store(
            self._store,
            self._keys,
            self._identity,
            post=self._queue.put,
            publish=self._channel.publish,
            stop=self._done,
            patience=self._timings.driver_timeout,
            clock=self._clock,
        )
