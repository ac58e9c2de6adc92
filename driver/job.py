"""The driver's main loop: launch workers, follow them, publish rounds, end the job.

One thread owns all state (``Job.run``); everything else only posts messages
(``driver.messages``) to its queue: worker exits (a waiter thread per process),
registrations, failure reports and rank 0's progress (store watches), discovery
results (a polling thread), signals, chaos ticks, a ps shard that cannot go on, a
claim on the job id lost to another driver (``driver.feeds``, ``driver.claim``). (The
store's health probe alone reports by itself: the loop may be what waits on the
store.) After each message the loop reconciles: it asks the rules of
``driver.policy`` what to do (stop displaced workers, kill hung ones, fill free slots,
publish the next round, wait, give up) and carries the decisions (``driver.decisions``)
out, one handler per kind of decision (and per kind of message). The rules are pure
functions; this module is the I/O they need: the store, the worker processes
(``driver.worker_processes``), the event log, the clock. What runs beside the workers
(the store itself, the claim on the job id, the feeds, the ps shards, the chaos) is
started and stopped by ``driver.job_services``.

A dead worker is noticed by whichever comes first: its process exit (the launcher),
its registration lease expiring, or a peer's failure report naming it.

``Job(config, launcher=..., events=..., clock=..., discovery=...)`` takes what it
drives, so tests run the whole loop with fake processes and a fake clock (what it
takes when given nothing: ``driver.job_defaults``); ``run()`` is ``open()``, ``turn()``
until the job ends, ``close()``. ``open()`` claims the job id (``driver.claim``);
``close()`` leaves nothing of the job in the store.
"""

from __future__ import annotations

import json
import logging
import queue
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Callable

from driver import adoption, feeds, job_defaults, policy, workers
from driver import decisions as dec
from driver import events as ev
from driver import messages as msg
from driver.adopted import EXIT_UNKNOWN, AdoptedProcesses
from driver.agents import AgentLauncher
from driver.config import JobConfig
from driver.discovery import HostDiscovery, is_local_host
from driver.errors import (
    DiscoveryError,
    JobFailed,
    LauncherError,
    LaunchError,
    LeadershipLost,
)
from driver.hosts import HostManager
from driver.job_services import JobServices
from driver.launch.launchers import Launcher
from driver.launch.process import WorkerProcess
from driver.leadership import ClaimAction, describe_leader, secret_id
from driver.probe import probe
from driver.threads import spawn
from driver.wiring import job_env, runs_all_local, worker_bind_host, worker_spec
from driver.worker_processes import WorkerProcesses
from driver.workers import WorkerRecord
from rendezvous import env
from rendezvous.auth import make_secret, secret_from_env
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.plan import DriverStateRecord, Plan, ProgressRecord, WorkerInfo
from rendezvous.store import PUT, Delete, KeyValue, KVStore, Put

log = logging.getLogger(__name__)

STATE_WRITE_INTERVAL = 0.5
"""Seconds between two writes of the driver's persisted state (``JobKeys.driver_state``)
when it keeps changing; a change is written at most this late."""


class Job:
    """One run of ``elastic-run``. ``run()`` returns the exit status.

    ``launcher`` starts workers and shards (default: ``--launcher`` with
    ``ELASTIC_SSH_OPTIONS``); ``events`` receives every event (default: an ``EventLog``
    of ``--events``); ``clock`` is the monotonic time the rules see; ``discovery`` finds
    the hosts (default: ``-H`` or ``--host-discovery-script``).

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
    ):
        job_defaults.make_log_dir(config)
        if events is None:
            events = job_defaults.event_log(config)
        self._agents: AgentLauncher | None = None
        if launcher is None:
            launcher = self._agents = job_defaults.agent_launcher(config)
        if discovery is None:
            discovery = job_defaults.discovery(config)
        self.config = config
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
        self.workers: dict[str, WorkerRecord] = {}
        self._processes = WorkerProcesses(
            launcher, lambda worker_id, code: self.post(msg.ProcessExited(worker_id, code))
        )
        self._adopted = AdoptedProcesses(self._adopted_gone)
        self._state_written: DriverStateRecord | None = None
        self._state_due = 0.0  # the next write of the persisted state, not before
        self.plan: Plan | None = None
        self.book = dec.Book(started_at=clock())
        self._waits: list[dec.Wait] = []
        # Whether the rules must run at the next turn: something they read changed, or a
        # wait they asked for is due (``_due``: the clock time it is).
        self._changed = True
        self._due = 0.0
        self._usable: tuple[str, ...] = ()  # the usable hosts' names, as of the last reconcile
        self._services = JobServices(
            config,
            self.keys,
            self.secret,
            all_local=self.all_local,
            launcher=launcher,
            events=events,
            clock=clock,
            post=self.post,
            stop=self._stop,
            usable_hosts=self._shard_hosts,
        )

    @property
    def store(self) -> KVStore | None:
        """The store's client (None until ``open``)."""
        return self._services.store

    @property
    def store_url(self) -> str:
        """The store URL the job's processes use ("" until ``open``)."""
        return self._services.store_url

    def post(self, message: msg.Message) -> None:
        """Hand a message to the main loop (thread-safe)."""
        if isinstance(message, msg.SignalReceived):
            self._services.interrupt(message.signum)  # open() may wait for the ps shards
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
        except (JobFailed, DiscoveryError, RendezvousError) as exc:
            rounds = self.plan.round_id if self.plan else 0
            seconds = round(self._clock() - self.book.started_at, 3)
            self.events.emit(ev.JobFailure(reason=str(exc), rounds=rounds, seconds=seconds))
            raise
        finally:
            self.close()

    def open(self) -> None:
        """Find the hosts, open the store, claim the job id, follow the store, start the
        ps shards and the chaos (``driver.job_services``).

        Raises:
            DiscoveryError: the first host discovery failed.
            RendezvousError: the store cannot be opened.
            JobIdInUseError: another driver leads a job of this id.
            JobFailed: the ps shards did not come up.
            LauncherError: a ps shard cannot be started.
        """
        cfg = self.config
        hosts = self.discovery.find_hosts()  # an error at start is fatal (DiscoveryError)
        self._services.open(hosts)
        claim = self._services.claim
        adopting = claim.taken.action is ClaimAction.ADOPT
        handed_over: dict[str, WorkerProcess] = {}
        if adopting and self._agents is not None:
            handed_over = dict(self._agents.adopt(self._services.snapshot))
        if self._agents is not None:
            self._agents.attach(
                self._services.require_store(),
                agent_env=job_env(cfg, self.secret, self.store_url),
                term=self._services.leader_term,
                on_host_lost=lambda host, detail: self.post(msg.AgentLost(host, detail)),
                stop=self._stop,
                patience=cfg.elastic_timeout,
                steer=self._services.steer,
            )
        if cfg.uses_discovery:
            feeds.poll_discovery(self.discovery, cfg.discovery_interval, self.post, self._stop)
        self._emit_host_events(self.hosts.update(hosts, self._clock()))
        self._usable = tuple(h.host for h in self.hosts.usable_hosts)
        if adopting:
            self._adopt(handed_over)
            workers_of = set(self.workers)
            self._services.adopt_shards(
                {k: p for k, p in handed_over.items() if k not in workers_of}
            )
        else:
            self._services.start_shards()
            self.events.emit(ev.Leading(claim.record.term, "started", 0, "", 0.0))
        self._services.start_chaos()

    def _adopt(self, handed_over: dict[str, WorkerProcess]) -> None:
        """Take the job over from the store's records (``driver.adoption``): its plan,
        its registered workers, the book and the blacklist. A worker's process is the
        handle its agent's records gave (``handed_over``, by worker id), else known
        from its registration alone (``driver.adopted``).

        Raises:
            JobFailed: this driver does not have the job's secret (it steps down first,
                leaving the job as it is for a driver that has).
        """
        claim, now = self._services.claim, self._clock()
        view = adoption.rebuild_view(
            self._services.snapshot, self.keys, now=now, wall_now=time.time()
        )
        if view.secret_id and view.secret_id != secret_id(self.secret):
            claim.step_down()
            raise JobFailed(
                f"cannot take over job {self.config.job_id!r}: this driver does not have the "
                "job's secret; start it with ELASTIC_JOB_SECRET set as it was for the job's "
                "first driver (the job was left as it is)"
            )
        self.plan, self.workers, self.book = view.plan, dict(view.workers), view.book
        for c in view.cooldowns:
            self.hosts.restore(c.host, c.strikes, c.until)
        self._processes.continue_ids_after(view.launched)
        for worker_id, (host, pid) in view.pids.items():
            rec = self.workers[worker_id]
            if not rec.state.running:
                continue
            process = handed_over.get(worker_id)
            if process is not None:
                self.events.emit(ev.WorkerAdopted(worker_id, rec.host, rec.slot, process.pid))
                self._processes.adopt(worker_id, process)
                continue
            self.events.emit(ev.WorkerAdopted(worker_id, rec.host, rec.slot, pid))
            self._adopted.adopt(worker_id, pid, local=self.all_local or is_local_host(host))
        for worker_id, process in handed_over.items():
            # Launched by the predecessor, running, not registered yet: it joins later.
            if worker_id in self.workers or env.ENV_WORKER_ID not in process.spec.env:
                continue
            spec = process.spec
            self.workers[worker_id] = WorkerRecord.launched(worker_id, spec.host, spec.slot, now)
            self.events.emit(ev.WorkerAdopted(worker_id, spec.host, spec.slot, process.pid))
            self._processes.adopt(worker_id, process)
        for rec in list(self.workers.values()):
            # What the predecessor was stopping or killing is asked again in this term
            # (an agent refuses its older term's request once it has seen ours).
            if rec.state.running and not rec.state.active:
                self._give_up_again(rec)
        previous = claim.taken.previous
        vacant_at = claim.taken.vacant_at
        self.events.emit(
            ev.Leading(
                claim.record.term,
                "adopted",
                sum(1 for r in self.workers.values() if r.state.running),
                describe_leader(previous) if previous is not None else "",
                round(time.monotonic() - vacant_at, 3) if vacant_at is not None else 0.0,
            )
        )

    def turn(self, max_wait: float | None = None) -> int | None:
        """One round of the loop: reconcile, check the outcome, then handle the next
        message (waiting up to the next wake-up, or ``max_wait``) and any that follow it.
        Returns the exit status once the job succeeded, else None.

        Raises:
            JobFailed: the job cannot succeed.
        """
        if self._changed or self._clock() >= self._due:
            self._reconcile()
            code = self._settle()
            if code is not None:
                return code
            self._persist_state()
            self._changed = False
            self._due = self._clock() + policy.next_wakeup(self._waits, self._clock())
        wait = max(self._due - self._clock(), policy.MIN_SLEEP)
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
        self._services.stop()
        if self._services.leads:
            running = [r.worker_id for r in self.workers.values() if r.state.running]
            self._adopted.stop_all([w for w in running if w in self._adopted])
            self._processes.stop_all([w for w in running if w not in self._adopted])
            if self._agents is not None:
                self._agents.close()
        self._services.close()

    # ------------------------------------------------------------------ decisions
    def _reconcile(self) -> None:
        now, records, cfg = self._clock(), self.workers, self.config
        self._emit_host_events(self.hosts.release_expired(now))
        view = dec.HostsView.of(self.hosts)
        self._usable = tuple(h.host for h in view.usable)
        self._waits = []
        self._apply(policy.hosts_rule(records, self.plan, self.book, view, cfg, now))
        self._apply(policy.workers_to_stop(records, view.usable))
        self._apply(policy.spares_to_stop(records, view.usable))
        self._apply(policy.workers_to_kill(records, now))
        self._apply(policy.lapse_waits(records))
        self._apply(policy.slots_to_fill(records, view.usable, self.book, cfg))
        self._step(policy.no_hosts(self.book, view, cfg, now))
        self._step(policy.progress_report(self.book, self.plan, cfg, now))
        self._step(policy.accusations_due(records, self.book, now))
        self._step(policy.plan_round(records, self.plan, self.book, view, cfg, now))
        # Last: a new spare's start must not delay the round a promotion just formed.
        self._apply(
            policy.spares_to_launch(records, self.plan, view.usable, self.book, cfg.spares, now)
        )

    def _settle(self) -> int | None:
        decision = policy.outcome(self.workers, self.plan, self.book)
        if isinstance(decision, dec.Fail):
            raise JobFailed(decision.reason)
        if isinstance(decision, dec.Succeed):
            self.events.emit(ev.JobDone(decision.round, decision.size, decision.resets))
            return 0
        return None

    def _apply(self, decisions: Sequence[dec.Decision]) -> None:
        for decision in decisions:
            _DECISIONS[type(decision)](self, decision)

    def _end(self, reason: str) -> None:
        raise JobFailed(reason)

    def _publish(self, decision: dec.Publish) -> None:
        plan = replace(decision.plan, term=self._services.claim.record.term)
        # One fenced write: the plan, the state that goes with it (its reset counted),
        # and the reports about older rounds, which this one settles; only while no
        # worker has recorded that its training returned: a round formed after that would
        # hand newcomers a finished training (JobKeys.training_finished).
        state = self._state_record()
        published = self._services.steer_unless(
            self.keys.training_finished,
            [
                Put(self.keys.round, plan.to_json()),
                Put(self.keys.driver_state, state.to_json()),
                Delete(self.keys.failures, prefix=True),
            ],
        )
        if published is None:
            log.info("round %d not formed: the training has finished", plan.round_id)
            self.book = replace(self.book, training_done=True)
            return
        self._state_written = state
        self.plan = plan
        self.book = self.book.new_round()
        self._processes.assign_ranks(plan)
        members = list(plan.worker_ids)
        self.events.emit(ev.RoundFormed(plan.round_id, plan.size, decision.seconds, members))

    def _kill(self, decision: dec.Kill) -> None:
        rec = self.workers.get(decision.worker_id)
        if rec is None or not rec.state.running:
            return
        log.info("killing worker %s: %s", rec.worker_id, decision.reason)
        self._services.claim.check()
        if rec.worker_id in self._adopted:
            self._adopted.kill(rec.worker_id)
        else:
            self._processes.kill(rec.worker_id)
        now = self._clock()
        self.workers[rec.worker_id] = workers.killed(
            rec, now, chaos=decision.chaos, reason=decision.reason
        )
        if self.plan is not None and self.plan.member(rec.worker_id) is not None:
            self.book = self.book.changed(now)

    def _stop_worker(self, decision: dec.Stop) -> None:
        rec = self.workers[decision.worker_id]
        self._services.claim.check()
        self.workers[rec.worker_id] = workers.stopping(rec, self._clock())
        if rec.worker_id in self._adopted:
            self._adopted.stop(rec.worker_id)
        else:
            self._processes.stop(rec.worker_id)

    def _launch(self, decision: dec.Launch) -> None:
        self._start_worker(decision.host, decision.slot, spare=False)

    def _launch_spare(self, decision: dec.LaunchSpare) -> None:
        self._start_worker(decision.host, decision.index, spare=True)

    def _start_worker(self, host: str, slot: int, spare: bool) -> None:
        """Start a worker in ``slot`` of ``host``, or (``spare``) the host's spare number
        ``slot``: one route for both."""
        self._services.claim.check()  # a driver that lost the lead starts nothing
        worker_id = self._processes.new_id(host, f"s{slot}" if spare else slot)
        bind = worker_bind_host(host, self.all_local, self._services.advertised_host)
        spec = worker_spec(
            self.config, self.secret, self.store_url, worker_id, host, slot, bind, spare
        )
        try:
            pid = self._processes.start(worker_id, spec)
        except LauncherError as exc:
            if spare:
                self._step(
                    policy.spare_launch_failed(worker_id, host, str(exc), self.book, self._clock())
                )
                return
            permanent = isinstance(exc, LaunchError) and exc.permanent
            self._apply(
                policy.launch_failed(
                    worker_id, host, slot, str(exc), None, self._any_registered(), permanent
                )
            )
            return
        now = self._clock()
        self.workers[worker_id] = WorkerRecord.launched(worker_id, host, slot, now, spare)
        self.events.emit(ev.WorkerStarted(worker_id, host, slot, pid, spare))

    def _promote(self, decision: dec.Promote) -> None:
        rec, now = self.workers[decision.worker_id], self._clock()
        self.events.emit(policy.promotion_event(rec, decision.slot, now))
        self.workers[rec.worker_id] = workers.promoted(rec, decision.slot, now)
        self.book = policy.spare_promoted(self.book.changed(now), rec.host, now)

    def _probe_host(self, decision: dec.Probe) -> None:
        def ask() -> None:
            result = probe(decision.address)
            self.post(msg.ProbeAnswered(decision.host, result.reachable, result.detail))

        spawn(f"probe-{decision.host}", ask)

    def _host_lost(self, decision: dec.HostLost) -> None:
        self._emit_host_events(self.hosts.host_lost(decision.host, self._clock()))

    def _count_failure(self, decision: dec.CountFailure) -> None:
        self._emit_host_events(self.hosts.record_failure(decision.host, self._clock()))
        slots = self.hosts.available_slots
        if decision.streak:
            decisions, self.book = policy.count_failure(
                self.book, slots, decision.code, decision.reason
            )
            self._apply(decisions)

    # ------------------------------------------------------------------ messages
    def _handle(self, message: msg.Message) -> None:
        if not msg.changes_nothing(message, self.plan):
            self._changed = True
        _MESSAGES[type(message)](self, message)

    def _on_exit(self, message: msg.ProcessExited) -> None:
        rec = self.workers.get(message.worker_id)
        if rec is None or not rec.state.running:
            return  # an adopted worker's end, seen twice (its pid, a kill that gave it up)
        if rec.info is not None:
            # Do not wait for its lease: the process is gone.
            self._services.delete_quietly(self.keys.worker(rec.worker_id))
        # An exit 0 after the worker's @elastic.run function returned: training is done.
        returned = self._services.has_key(self.keys.finished(rec.worker_id))
        self.workers[rec.worker_id], (decisions, self.book) = policy.worker_exited(
            rec,
            message.code,
            self.plan,
            self.book,
            self._clock(),
            command=self.config.command,
            any_registered=self._any_registered(),
            trained_to_end=returned and message.code == 0,
        )
        if returned and message.code != 0 and not self.book.done_slots:
            # Its training returned, then it failed: a finish counts once its worker exits
            # 0, so the job goes on as if it had not finished (relaunch, re-form, and the
            # rules for workers failing at their end).
            self._services.delete_quietly(self.keys.finished(rec.worker_id))
            self._services.delete_quietly(self.keys.training_finished)
            self.book = replace(self.book, training_done=False)
        self._apply(decisions)

    def _on_registry(self, message: msg.RegistryChanged) -> None:
        event = message.event
        worker_id = event.key[len(self.keys.workers) :]
        self._set_registration(worker_id, event.kv if event.type == PUT else None)

    def _on_registry_resync(self, message: msg.RegistryResync) -> None:
        """The registrations as read afresh after the registry watch was lost."""
        registered = {kv.key[len(self.keys.workers) :]: kv for kv in message.kvs}
        for rec in list(self.workers.values()):
            if rec.state.running and (rec.worker_id in registered or rec.info is not None):
                self._set_registration(rec.worker_id, registered.get(rec.worker_id))

    def _set_registration(self, worker_id: str, kv: KeyValue | None) -> None:
        """Worker ``worker_id`` is registered as ``kv``, or no longer (None)."""
        rec = self.workers.get(worker_id)
        if rec is None or not rec.state.running:
            return
        now = self._clock()
        if kv is None and self._adopted.lapsed(worker_id):
            return  # an adopted worker on another host: its lapse is its end (posted)
        if kv is None:
            self.workers[worker_id] = workers.unregistered(rec, now)
        else:
            info = WorkerInfo.from_json(kv.value)
            self.workers[worker_id] = workers.registered(rec, info, kv.create_revision, now)
        if not rec.spare:
            self.book = self.book.changed(now)
        elif kv is not None and not rec.ever_registered:  # no membership changed
            took = round(now - rec.launched_at, 3)
            self.events.emit(ev.SpareReady(worker=worker_id, host=rec.host, took=took))

    def _on_failure_report(self, message: msg.FailureReport) -> None:
        if message.event.type != PUT:
            return
        report = json.loads(message.event.value)
        if report.get("silent"):
            decisions, self.book = policy.silence_reported(
                self.workers, self.plan, self.book, report
            )
            self._apply(decisions)
        else:
            self._step(
                policy.failure_reported(self.workers, self.plan, self.book, report, self._clock())
            )

    def _on_probe_answered(self, message: msg.ProbeAnswered) -> None:
        decisions, self.book = policy.probe_answered(
            self.workers, self.book, message.host, message.reachable, message.detail
        )
        self._apply(decisions)

    def _on_agent_lost(self, message: msg.AgentLost) -> None:
        """A host whose agent stopped answering is lost, as a host that does not answer
        a probe: its workers are dropped at once and the host blacklisted."""
        self._on_probe_answered(msg.ProbeAnswered(message.host, False, message.detail))

    def _on_progress(self, message: msg.ProgressReported) -> None:
        try:
            record = ProgressRecord.from_json(message.value)
        except (ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable progress record: %s", exc)
            return
        self.book = self.book.progressed(record.step, self._clock())

    def _step(self, step: dec.Step) -> None:
        """Carry out a rule's decisions and keep its book."""
        decisions, self.book = step
        self._apply(decisions)

    def _on_chaos_tick(self, message: msg.ChaosTick) -> None:
        chaos = self._services.chaos
        candidates = policy.chaos_candidates(self.workers, self.plan, self.book)
        victim = chaos.strike(candidates) if chaos and candidates else None
        if victim is not None and chaos is not None:
            pid = self._adopted.pid(victim) if victim in self._adopted else None
            pid, kills = pid or self._processes.pid(victim), chaos.kills
            self._apply(policy.chaos_kill(self.workers[victim], self.plan, pid, kills))

    # ------------------------------------------------------------------ the lead
    def _give_up_again(self, rec: WorkerRecord) -> None:
        """Stop (or kill) an adopted worker the predecessor had given up on."""
        worker_id = rec.worker_id
        stop = rec.state is workers.WorkerState.STOPPING
        if worker_id in self._processes:
            (self._processes.stop if stop else self._processes.kill)(worker_id)
        elif worker_id in self._adopted:
            (self._adopted.stop if stop else self._adopted.kill)(worker_id)

    def _adopted_gone(self, worker_id: str) -> None:
        """An adopted worker is gone (a helper thread): its exit, code unknown, unless
        it said it finished its training (then 0)."""
        finished = self._services.has_key(self.keys.finished(worker_id))
        self.post(msg.ProcessExited(worker_id, 0 if finished else EXIT_UNKNOWN))

    def _state_record(self) -> DriverStateRecord:
        now = self._clock()
        cooldowns = [adoption.Cooldown(h, n, u) for h, n, u in self.hosts.cooldowns()]
        return adoption.state_record(
            self._services.claim.record.term,
            self.book,
            cooldowns,
            self._processes.launched,
            self.workers,
            secret_id(self.secret),
            now=now,
            wall_now=time.time(),
        )

    def _persist_state(self) -> None:
        """Write the persisted state when it changed, at most every
        ``STATE_WRITE_INTERVAL`` (fenced: ``LeadershipLost`` if another driver leads)."""
        record = self._state_record()
        if not adoption.state_changed(self._state_written, record):
            return
        now = self._clock()
        if now < self._state_due:
            self._waits.append(dec.Wait(self._state_due, "the next write of the driver state"))
            return
        try:
            self._services.steer([Put(self.keys.driver_state, record.to_json())])
        except RendezvousError as exc:
            log.warning("could not write the driver's state: %s", exc)
            return
        self._state_written, self._state_due = record, now + STATE_WRITE_INTERVAL

    def _lead_lost(self, message: msg.LeadLost) -> None:
        raise LeadershipLost(message.reason)

    # ------------------------------------------------------------------ helpers
    def _emit_host_events(self, host_events: Sequence[ev.HostEvent]) -> None:
        for host_event in host_events:
            self.events.emit(host_event)
        if host_events:
            self.book = self.book.changed(self._clock())

    def _shard_hosts(self) -> tuple[str, ...]:
        """The hosts a ps shard may be started on now (read from the ps supervisor's
        threads: a snapshot the loop replaces at each reconcile, minus the hosts whose
        agent was just lost, which the loop may not have handled yet)."""
        lost = self._agents.lost_hosts() if self._agents is not None else frozenset()
        return tuple(h for h in self._usable if h not in lost)

    def _any_registered(self) -> bool:
        """A worker of this job has registered: its program can start."""
        return any(r.ever_registered for r in self.workers.values())


_DECISIONS: dict[type, Callable[[Job, Any], object]] = {
    dec.Publish: Job._publish,
    dec.Wait: lambda job, d: job._waits.append(d),
    dec.Fail: lambda job, d: job._end(d.reason),
    dec.Kill: Job._kill,
    dec.Stop: Job._stop_worker,
    dec.Launch: Job._launch,
    dec.LaunchSpare: Job._launch_spare,
    dec.Promote: Job._promote,
    dec.Report: lambda job, d: job.events.emit(d.event),
    dec.CountFailure: Job._count_failure,
    dec.Probe: Job._probe_host,
    dec.HostLost: Job._host_lost,
}

_MESSAGES: dict[type, Callable[[Job, Any], object]] = {
    msg.ProcessExited: Job._on_exit,
    msg.RegistryChanged: Job._on_registry,
    msg.RegistryResync: Job._on_registry_resync,
    msg.FailureReport: Job._on_failure_report,
    msg.ProbeAnswered: Job._on_probe_answered,
    msg.AgentLost: Job._on_agent_lost,
    # Missed reports are hints superseded by process exits: nothing to catch up on.
    msg.FailureResync: lambda job, m: None,
    msg.HostsFound: lambda job, m: job._emit_host_events(job.hosts.update(m.hosts, job._clock())),
    msg.DiscoveryFailed: lambda job, m: job.events.emit(ev.HostDiscoveryFailed(m.error)),
    msg.SignalReceived: lambda job, m: job._end(
        f"stopped by {signal.Signals(m.signum).name}; all workers were stopped"
    ),
    msg.StoreLost: lambda job, m: job._end(f"lost the rendezvous store: {m.reason}"),
    msg.ProgressReported: Job._on_progress,
    msg.KillRequested: lambda job, m: job._kill(dec.Kill(m.worker_id, m.reason)),
    msg.ChaosTick: Job._on_chaos_tick,
    msg.Fatal: lambda job, m: job._end(m.reason),
    msg.LeadLost: Job._lead_lost,
}
