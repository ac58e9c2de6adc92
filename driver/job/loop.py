"""The driver's main loop: launch workers, follow them, publish rounds, end the job.

One thread owns all state (``Job.run``); everything else only posts messages
(``driver.job.messages``) to its queue: worker exits (a waiter thread per process),
registrations, failure reports and rank 0's progress (store watches), discovery
results (a polling thread), signals, chaos ticks, a ps shard that cannot go on, a
claim on the job id lost to another driver, the store's probe past its bound
(``driver.job.feeds``, ``driver.leadership.claim``). After each message the loop
reconciles: it asks the rules of ``driver.policy`` what to do (stop displaced workers,
kill hung ones, fill free slots, publish the next round, wait, give up; under
``--restart-workers``, stop and start whole worlds instead: ``driver.policy.restarts``)
and carries the decisions (``driver.policy.decisions``) out, one handler per kind of
decision (and per kind of message). The rules are pure functions; this module is
the I/O they need: the store, the worker processes (``driver.job.processes``), the
event log, the clock. What runs beside the workers is started and stopped by its own
part: the store and the claim on the job id (``driver.job.session``, its fenced
writes: ``driver.job.fenced``), the ps shards
(``driver.job.shards``), the chaos (``driver.job.chaos``). Each part of the loop is
given by name only the collaborators it uses: the takeover and the lead's writes
(``driver.job.lead``), the workers' starts, stops and kills (``driver.job.actions``),
the messages about workers (``driver.job.handlers``), the hosts' decisions and the
discovery's news (``driver.job.host_actions``). Dispatch is by two tables of
named handlers, one per kind of decision and one per kind of message
(``Job._decision_handlers``, ``Job._message_handlers``, carried out by
``driver.job.dispatch``; each dispatch is logged at debug level). Each part returns the
decisions it leads to and the loop carries them out: no part calls back into the loop.
Which rules run, in what order, is the rules' turn (``driver.job.reconcile``).

A dead worker is noticed by whichever comes first: its process exit (the launcher), its
registration lease expiring, or a peer's failure report naming it.

``Job(config, launcher=..., events=..., clock=..., discovery=...)`` takes what it
drives, so tests run the whole loop with fake processes and a fake clock (what it
takes when given nothing: ``driver.job.defaults``); ``run()`` is ``open()``, ``turn()``
until the job ends, ``close()``. ``open()`` claims the job id (``driver.leadership.claim``);
``close()`` leaves nothing of the job in the store.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections.abc import Sequence
from typing import Callable, NoReturn

from driver import events as ev
from driver.checkpoint_folder import newest_snapshot
from driver.config import JobConfig
from driver.errors import DiscoveryError, JobFailed, JobLeft, JobStopped, LeadershipLost
from driver.hosts.discovery import HostDiscovery
from driver.hosts.manager import HostManager
from driver.job import defaults, dispatch, feeds, reconcile, stopping
from driver.job import messages as msg
from driver.job.actions import WorkerActions
from driver.job.chaos import chaos_monkey
from driver.job.dispatch import Dispatch, Handler
from driver.job.fenced import FencedStore
from driver.job.handlers import MessageHandlers
from driver.job.host_actions import HostActions
from driver.job.lead import JobLead, adopted_exit_reporter
from driver.job.processes import HeldWorkers, WorkerProcesses
from driver.job.session import StoreSession
from driver.job.shards import JobShards
from driver.job.state import JobState
from driver.job.wiring import runs_all_local
from driver.job.worker_parts import WorkerParts
from driver.join import ended
from driver.launch.assignments.service import AgentService, AgentWiring, NoAgents
from driver.launch.base import Launcher
from driver.launch.process import WorkerProcess
from driver.leadership.adopted_pids import AdoptedProcesses
from driver.leadership.terms import ClaimAction
from driver.policy import decisions as dec
from driver.policy import rounds
from driver.policy.lapses import store_lost_line
from driver.policy.lifecycle import WorkerRecord
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.net.auth import make_secret, secret_from_env
from rendezvous.schema.rounds import Plan
from rendezvous.store import KVStore


class Job:
    """One run of ``elastic-run``. ``run()`` returns the exit status.

    ``launcher`` starts workers and shards (default: ``--launcher`` with
    ``ELASTIC_SSH_OPTIONS``, behind the per-host agents); ``events`` receives every
    event (default: an ``EventLog`` of ``--events``); ``clock`` is the monotonic time the
    rules see; ``discovery`` finds the hosts (default: ``-H`` or
    ``--host-discovery-script``).

    Raises (when made):
        UsageError: ``--log-dir`` cannot be created or ``--events`` cannot be opened.
    """

    def __init__(
        self,
        config: JobConfig,
        *,
        launcher: Launcher | None = None,
        events: ev.EventSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        discovery: HostDiscovery | None = None,
        leave: Callable[[], None] | None = None,
    ):
        defaults.make_log_dir(config)
        if events is None:
            events = defaults.event_log(config)
        # A job given its own launcher runs no agents (tests drive the loop with fakes).
        agents: AgentService = NoAgents()
        if launcher is None:
            launcher = agents = defaults.agent_launcher(config)
        if discovery is None:
            discovery = defaults.discovery(config)
        self.config = config
        self._leave = leave  # join mode: this node's host drains (its agent is told)
        self._leaving = False  # SIGTERM came to a joined node
        self._outcome: ended.JobOutcome | None = None  # how the job ended, once it did
        self.events = events
        self.discovery = discovery
        self.keys = JobKeys(config.job_id)
        # A driver taking over a job launches with the job's secret: every driver of
        # one job is given the same ELASTIC_JOB_SECRET (a fresh one otherwise).
        self.secret = secret_from_env() or make_secret()
        self.hosts = HostManager(config.blacklist_policy, config.min_np, config.max_np)
        self.all_local = runs_all_local(config)
        self._clock = clock
        self._queue: queue.Queue[msg.Message] = queue.Queue()
        self._stop = threading.Event()  # the job is over: the helper threads end
        self._store_gone = False  # the job ends for want of its store (``StoreLost``)
        self._waits: list[dec.Wait] = []
        # Whether the rules must run at the next turn: something they read changed, or a
        # wait they asked for is due (``_due``: the clock time it is).
        self._changed = True
        self._due = 0.0
        self._usable: tuple[str, ...] = ()  # the usable hosts' names, as of the last reconcile
        # What runs beside the workers, each part given only what it uses.
        session = StoreSession(
            config,
            self.secret,
            all_local=self.all_local,
            events=events,
            clock=clock,
            post=self.post,
            stop=self._stop,
        )
        self._session = session
        self._fenced = fenced = FencedStore(session)
        self._shards = JobShards(
            config,
            session,
            launcher=launcher,
            events=events,
            clock=clock,
            post=self.post,
            usable_hosts=self._shard_hosts,
        )
        self._chaos = chaos_monkey(config, self.post)
        self._state = state = JobState(book=dec.Book.start(clock()))
        self._agents = agents
        held = HeldWorkers(
            WorkerProcesses(
                launcher, lambda worker_id, code: self.post(msg.ProcessExited(worker_id, code))
            ),
            AdoptedProcesses(adopted_exit_reporter(fenced, self.keys, self.post)),
        )
        self._lead = lead = JobLead(state, session, fenced, self.hosts, held, events, clock)
        parts = WorkerParts(state, session, fenced, held)
        self._actions = WorkerActions(parts, lead, events, clock)
        self._messages = MessageHandlers(parts, self._chaos, events, clock)
        self._stops = stopping.StopControl(state, session, lead, self._messages, events, clock)
        self._host_actions = HostActions(state, self.hosts, agents, events, clock, self.post)
        self._dispatch = Dispatch(state, self._decision_handlers(), self._message_handlers())

    @property
    def workers(self) -> dict[str, WorkerRecord]:
        """The workers' records by id."""
        return self._state.workers

    @property
    def plan(self) -> Plan | None:
        """The round published (None before the first)."""
        return self._state.plan

    @property
    def book(self) -> dec.Book:
        """What the rules remember between two turns."""
        return self._state.book

    @book.setter
    def book(self, book: dec.Book) -> None:
        self._state.book = book

    @property
    def store(self) -> KVStore | None:
        """The store's client (None until ``open``)."""
        return self._session.store

    @property
    def store_url(self) -> str:
        """The store URL the job's processes use ("" until ``open``)."""
        return self._session.store_url

    def post(self, message: msg.Message) -> None:
        """Hand a message to the main loop (thread-safe)."""
        if isinstance(message, msg.SignalReceived):
            if self._leave is not None and message.signum == signal.SIGTERM:
                self._leaving = True
                self._leave()  # join mode: this node's host drains (as a preemption)
            self._session.interrupt()  # a standby's wait for its leader ends
            self._shards.interrupt(message.signum)  # open() may wait for the ps shards
        self._queue.put(message)

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        """Run the job to its end. Returns 0 on success.

        Raises:
            JobFailed: the job cannot succeed (the one-line reason).
            DiscoveryError: the first host discovery failed.
            RendezvousError: the store could not be opened or used.
        """
        try:
            with feeds.posting_signals(self.post):
                self.open()
                while True:
                    code = self.turn()
                    if code is not None:
                        return code
        except LeadershipLost as exc:
            self.events.emit(ev.LeadershipLostEvent(reason=str(exc)))
            raise
        except JobStopped as exc:
            self._outcome = ended.outcome_of(ended.STOPPED, str(exc))
            raise
        except (JobFailed, DiscoveryError, RendezvousError) as exc:
            rounds = self.plan.round_id if self.plan else 0
            seconds = round(self._clock() - self.book.rounds.started_at, 3)
            self.events.emit(ev.JobFailure(reason=str(exc), rounds=rounds, seconds=seconds))
            self._outcome = ended.outcome_of(ended.FAILED, str(exc))
            raise
        finally:
            self.close()

    def open(self) -> None:
        """Find the hosts, open the store, claim the job id, follow the store
        (``driver.job.session``), start the ps shards (``driver.job.shards``) and the
        chaos (``driver.job.chaos``).

        Raises:
            DiscoveryError: the first host discovery failed.
            RendezvousError: the store cannot be opened.
            JobIdInUseError: another driver leads a job of this id.
            JobFailed: the ps shards did not come up.
            JobStopped: SIGINT or SIGTERM came while they started.
            LauncherError: a ps shard cannot be started.
        """
        cfg = self.config
        hosts = self.discovery.find_hosts()  # an error at start is fatal (DiscoveryError)
        try:
            self._session.open(hosts)
        except JobFailed:
            if self._leaving:  # a joined node's SIGTERM ended its wait as a standby
                raise JobLeft("left the job while standing by; its host drains") from None
            raise
        claim = self._session.claim
        adopting = claim.taken.action is ClaimAction.ADOPT
        handed_over: dict[str, WorkerProcess] = {}
        if adopting:
            handed_over = dict(self._agents.adopt(self._session.snapshot))
            if cfg.uses_discovery:  # found before a standby's wait: take those of now
                with contextlib.suppress(DiscoveryError):
                    hosts = self.discovery.find_hosts()
        self._agents.attach(
            AgentWiring(
                self._session.require_store(),
                agent_env=self._session.wiring.env(),
                on_host_lost=lambda host, detail: self.post(msg.AgentLost(host, detail)),
                on_host_ready=lambda host: self.post(msg.AgentReady(host)),
                patience=cfg.elastic_timeout,
                leader=self._fenced,
                store_trouble=self._session.store_trouble.explains_lapse,
            )
        )
        if cfg.uses_discovery:
            feeds.poll_discovery(self.discovery, cfg.discovery_interval, self.post, self._stop)
        self._host_actions.emit(self.hosts.update(hosts, self._clock()))
        self._usable = tuple(h.host for h in self.hosts.usable_hosts)
        if adopting:
            self._lead.adopt(handed_over)
            workers_of = set(self.workers)
            self._shards.adopt({k: p for k, p in handed_over.items() if k not in workers_of})
        else:
            try:
                self._shards.start()
            except JobStopped as exc:  # a signal while they started: said like any stop
                self._stops.end(str(exc), exc.signum)
            self.events.emit(ev.Leading(claim.record.term, "started", 0, "", 0.0))
        if self._chaos is not None:
            self._chaos.start()

    def turn(self, max_wait: float | None = None) -> int | None:
        """One round of the loop: reconcile, check the outcome, then handle the next
        message (waiting up to the next wake-up, or ``max_wait``) and any that follow it.
        Returns the exit status once the job succeeded, else None.

        Raises:
            JobFailed: the job cannot succeed.
            JobStopped: SIGTERM or SIGINT stopped it (after its final snapshot).
        """
        if self._stops.active:
            self._stops.turn(self._queue, max_wait, self._handle)
            return None
        if self._changed or self._clock() >= self._due:
            self._reconcile()
            code = self._settle()
            if code is not None:
                return code
            self._waits.extend(self._lead.persist())
            self._changed = False
            self._due = self._clock() + rounds.next_wakeup(self._waits, self._clock())
        wait = max(self._due - self._clock(), rounds.MIN_SLEEP)
        try:
            message = self._queue.get(timeout=wait if max_wait is None else min(wait, max_wait))
        except queue.Empty:
            self._changed = True  # a wake-up: the rules see the time move on
            return None
        self._handle(message)
        while True:  # drain what else arrived: one reconcile for a burst
            try:
                self._handle(self._queue.get_nowait())
            except queue.Empty:
                return None

    def close(self) -> None:
        """Stop the chaos, the shards and every worker; delete the job's keys and end
        the driver's lease (when this driver still leads the job: one that lost the
        lead leaves the job's processes and keys to the new leader); close the store."""
        self._stop.set()
        self.discovery.cancel()  # a script still running must not outlive the job
        if self._chaos is not None:
            self._chaos.stop()
        self._shards.stop(self._session.leads)
        if self._session.leads and not self._store_gone:  # (lost: ``_store_lost`` stopped them)
            self._actions.stop_all()
            self._agents.close()
        self._agents.stop_following()
        self._session.close(self._outcome, self._store_gone)  # (join: driver.join.ended)
        self.discovery.close()  # after the poll's thread is told to stop (``_stop``)

    # ------------------------------------------------------------------ decisions
    def _reconcile(self) -> None:
        """The rules' turn (``driver.job.reconcile``), once the hosts' blacklist terms
        that ran out are released."""
        now = self._clock()
        self._host_actions.emit(self.hosts.release_expired(now))
        view = dec.HostsView.of(self.hosts)
        self._usable = tuple(h.host for h in view.usable)
        self._waits = []
        cfg, state = self.config, self._state
        trouble = self._session.store_trouble.latest()  # (on the monotonic clock)
        trouble_at = None if trouble is None else now - (time.monotonic() - trouble)
        reconcile.rules_turn(
            cfg, state, view, self._host_actions, self._agents, self._dispatch, now, trouble_at
        )

    def _settle(self) -> int | None:
        decision = reconcile.outcome(self.config, self._state)
        if isinstance(decision, dec.Fail):
            raise JobFailed(decision.reason)
        if isinstance(decision, dec.Succeed):
            # The ps shards stop first: what the job trained is in their final
            # checkpoint, and a job that could not write it is no plain success.
            lost = self._shards.stop(self._session.leads)
            if lost is not None:
                raise JobFailed(f"training finished, but {lost}")
            d, world = decision, self.config.restart_workers
            done = ev.JobDone(d.round, d.size, d.resets, d.step, world)
            self.events.emit(done)
            self._outcome = ended.outcome_of(ended.DONE, str(done))
            return 0
        return None

    def _decision_handlers(self) -> dict[type, Handler]:
        """What carries out each kind of decision: a handler returns the decisions it
        leads to, and ``Dispatch.apply`` carries them out in turn."""
        actions, lead, hosts = self._actions, self._lead, self._host_actions
        return {
            dec.Publish: lead.publish,
            dec.Wait: self._wait,
            dec.Fail: dispatch.fail,
            dec.Kill: actions.kill,
            dec.Stop: actions.stop,
            dec.Leave: actions.leave,
            dec.Launch: actions.launch,
            dec.LaunchSpare: actions.launch_spare,
            dec.Promote: actions.promote,
            dec.Report: self._report,
            dec.CountFailure: hosts.count_failure,
            dec.Probe: hosts.probe,
            dec.HostLost: hosts.host_lost,
            dec.RetireAgent: hosts.retire_agent,
            dec.SnapshotNow: self._snapshot_now,
            dec.StartWorld: actions.start_world,
            dec.PrepareHost: hosts.prepare_host,
        }

    def _message_handlers(self) -> dict[type, Handler]:
        """What handles each kind of message: a handler returns the decisions it leads
        to, which ``Dispatch.handle`` carries out."""
        on = self._messages
        return {
            msg.ProcessExited: on.on_exit,
            msg.RegistryChanged: on.on_registry,
            msg.RegistrationRead: on.on_registration_read,
            msg.RegistryResync: on.on_registry_resync,
            msg.FailureReport: on.on_failure_report,
            msg.ProbeAnswered: on.on_probe_answered,
            msg.AgentLost: on.on_agent_lost,
            msg.AgentReady: dispatch.nothing,  # the rules' next turn sees the host ready
            msg.FailureResync: on.on_failure_resync,
            msg.HostsFound: self._host_actions.hosts_found,
            msg.DiscoveryFailed: self._host_actions.discovery_failed,
            msg.SignalReceived: self._signalled,
            msg.StacksAsked: on.on_stacks_asked,
            msg.StoreLost: self._store_lost,
            msg.ProgressReported: on.on_progress,
            msg.TrainingFinished: on.on_finished,
            msg.SnapshotReported: on.on_snapshot,
            msg.HostPreempted: on.on_preempted,
            msg.KillRequested: self._kill_requested,
            msg.ChaosTick: on.on_chaos_tick,
            msg.Fatal: dispatch.fatal,
            msg.LeadLost: dispatch.lead_lost,
        }

    def _report(self, decision: dec.Report) -> Sequence[dec.Decision]:
        self.events.emit(decision.event)
        return ()

    def _snapshot_now(self, decision: dec.SnapshotNow) -> Sequence[dec.Decision]:
        self._lead.publish_snapshot_round(decision.plan)
        return ()

    def _wait(self, decision: dec.Wait) -> Sequence[dec.Decision]:
        self._waits.append(decision)
        return ()

    # ------------------------------------------------------------------ messages
    def _handle(self, message: msg.Message) -> None:
        if self._dispatch.handle(message):
            self._changed = True

    def _signalled(self, message: msg.SignalReceived) -> Sequence[dec.Decision]:
        join = self.config.join
        if join and self._leaving and message.signum == signal.SIGTERM:
            others = self._agents.node_hosts() - {join.host}
            if others:  # a node leaves a job that goes on: its host drains, others lead
                if self._session.leads:
                    self._session.claim.step_down()
                raise JobLeft(f"left the job: {join.host} drains; {len(others)} node(s) go on")
        self._stops.signalled(message.signum)  # a stop starts, or the job ends now
        return ()

    def _store_lost(self, message: msg.StoreLost) -> NoReturn:
        self._store_gone = True
        if self._session.leads:  # first: rank 0 snapshots until it is stopped
            self._agents.close(tell=False)  # (no word through the store: each agent's
            # processes are stopped, its workers with them)
        book = self._state.book
        folder = self.config.checkpoint_dir
        line = store_lost_line(
            message.reason,
            book.progress.step,
            book.progress.snapshots,
            folder,
            newest_snapshot(folder, self.config.job_id) if folder else None,
        )
        raise JobFailed(line)

    def _kill_requested(self, message: msg.KillRequested) -> Sequence[dec.Decision]:
        return self._actions.kill(dec.Kill(message.worker_id, message.reason))

    # ------------------------------------------------------------------ helpers
    def _shard_hosts(self) -> tuple[str, ...]:
        """The hosts a ps shard may be started on now (read from the ps supervisor's
        threads: a snapshot the loop replaces at each reconcile, minus the hosts whose
        agent was just lost, which the loop may not have handled yet)."""
        lost = self._agents.lost_hosts()
        return tuple(h for h in self._usable if h not in lost)
