"""The driver's main loop: launch workers, follow them, publish rounds, end the job.

One thread owns all state (``Job.run``); everything else only posts messages
(``driver.messages``) to its queue: worker exits (a waiter thread per process),
registrations and failure reports (store watches), discovery results (a polling
thread), signals, chaos ticks, a ps shard that cannot go on. After each message the
loop reconciles: it asks the rules of ``driver.policy`` what to do (stop displaced
workers, kill hung ones, fill free slots, publish the next round, wait, give up) and
carries the decisions out. The rules are pure functions; this module is the I/O around
them: the store, the processes, the event log, the clock.

A dead worker is noticed by whichever comes first: its process exit (the launcher),
its registration lease expiring, or a peer's failure report naming it.

``Job(config, launcher=..., events=..., clock=..., discovery=...)`` takes what it
drives, so tests run the whole loop with fake processes and a fake clock; ``run()``
is ``open()``, ``turn()`` until the job ends, ``close()``.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import threading
import time
from typing import Any, Callable, Sequence

from driver import policy, workers
from driver.chaos import ChaosMonkey
from driver.config import JobConfig
from driver.discovery import FixedDiscovery, HostDiscovery, ScriptDiscovery, is_local_host
from driver.errors import DiscoveryError, JobFailed, LauncherError
from driver.eventlog import EventLog
from driver.events import (ChaosKill, EventSink, FailureReported, HostDiscoveryFailed,
                           HostEvent, JobDone, JobFailure, JobStarted, RoundFormed, WorkerFailed,
                           WorkerStarted, WorkerStopping)
from driver.hosts import HostManager
from driver.launch.launchers import Launcher, get_launcher
from driver.launch.process import STOP_GRACE, WorkerProcess, stop_all
from driver.launch.spec import ssh_settings_from_env
from driver.messages import (ChaosTick, DiscoveryFailed, FailureReport, FailureResync, Fatal,
                             HostsFound, KillRequested, Message, ProcessExited, RegistryChanged,
                             RegistryResync, SignalReceived, StoreLost, posting_signals)
from driver.policy import Decision
from driver.ps_supervisor import PSSupervisor
from driver.watch import follow_prefix
from driver.wiring import job_env, open_job_store, shard_commands, worker_id_for, worker_spec
from driver.workers import WorkerRecord
from rendezvous.auth import make_secret
from rendezvous.embedded import EmbeddedServer
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.plan import Plan, WorkerInfo
from rendezvous.store import PUT, Event, KeyValue, KVStore

log = logging.getLogger(__name__)


class Job:
    """One run of ``elastic-run``. ``run()`` returns the exit status.

    ``launcher`` starts workers and shards (default: ``--launcher`` with
    ``ELASTIC_SSH_OPTIONS``); ``events`` receives every event (default: an ``EventLog``
    of ``--events``); ``clock`` is the monotonic time the rules see; ``discovery`` finds
    the hosts (default: ``-H`` or ``--host-discovery-script``)."""

    def __init__(self, config: JobConfig, *, launcher: Launcher | None = None,
                 events: EventSink | None = None, clock: Callable[[], float] = time.monotonic,
                 discovery: HostDiscovery | None = None):
        self.config = config
        self.events: EventSink = (events if events is not None else
                                  EventLog(config.events_file, verbose=config.verbosity > 0))
        self.keys = JobKeys(config.job_id)
        self.secret = make_secret()
        self.hosts = HostManager(config.blacklist_policy, config.min_np, config.max_np)
        self.discovery: HostDiscovery = discovery if discovery is not None else (
            ScriptDiscovery(config.discovery_script, config.slots_per_host)
            if config.uses_discovery else FixedDiscovery(config.hosts))
        self.all_local = not config.uses_discovery and all(is_local_host(h.host)
                                                           for h in config.hosts)
        self._launcher = launcher if launcher is not None else get_launcher(
            config.launcher, ssh_settings=ssh_settings_from_env(os.environ))
        self._clock = clock
        self._queue: queue.Queue[Message] = queue.Queue()
        self._stop = threading.Event()
        self.workers: dict[str, WorkerRecord] = {}
        self._processes: dict[str, WorkerProcess] = {}
        self._launch_seq = 0
        self.plan: Plan | None = None
        self.book = policy.Book(started_at=clock())
        self._waits: list[policy.Wait] = []
        self._server: EmbeddedServer | None = None
        self.store: KVStore | None = None
        self.store_url = ""
        self._ps: PSSupervisor | None = None
        self._chaos: ChaosMonkey | None = None
        if config.log_dir:
            os.makedirs(config.log_dir, exist_ok=True)

    @property
    def advertised_host(self) -> str:
        """How other machines reach this one (for servers the driver runs)."""
        return socket.getfqdn()

    def post(self, message: Message) -> None:
        """Hand a message to the main loop (thread-safe)."""
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
            with posting_signals(self.post):
                self.open()
                while True:
                    code = self.turn()
                    if code is not None:
                        return code
        except (JobFailed, DiscoveryError, RendezvousError) as exc:
            self.events.emit(JobFailure(
                reason=str(exc), rounds=self.plan.round_id if self.plan else 0,
                seconds=round(self._clock() - self.book.started_at, 3)))
            raise
        finally:
            self.close()

    def open(self) -> None:
        """Find the hosts, open the store, follow it, start the ps shards and the chaos.

        Raises:
            DiscoveryError: the first host discovery failed.
            RendezvousError: the store cannot be opened.
            JobFailed: the ps shards did not come up.
            LauncherError: a ps shard cannot be started.
        """
        hosts = self.discovery.find_hosts()  # an error at start is fatal (DiscoveryError)
        self._server, self.store, self.store_url = open_job_store(
            self.config, self.keys, self.secret, self.all_local, self.advertised_host)
        self._follow_store()
        self._emit_host_events(self.hosts.update(hosts, self._clock()))
        cfg = self.config
        if cfg.num_ps:
            self._ps = self._make_ps_supervisor()
            self._ps.start()
        if cfg.chaos_kill_interval:
            self._chaos = ChaosMonkey(cfg.chaos_kill_interval, cfg.chaos_max_kills,
                                      on_tick=lambda: self.post(ChaosTick()))
            self._chaos.start()
        self.events.emit(JobStarted(job_id=cfg.job_id, store=self.store_url, np=cfg.np,
                                    min_np=cfg.min_np, max_np=cfg.max_np,
                                    command=list(cfg.command)))

    def turn(self, max_wait: float | None = None) -> int | None:
        """One round of the loop: reconcile, check the outcome, then handle the next
        message (waiting up to the next wake-up, or ``max_wait``) and any that follow it.
        Returns the exit status once the job succeeded, else None.

        Raises:
            JobFailed: the job cannot succeed.
        """
        self._reconcile()
        code = self._settle()
        if code is not None:
            return code
        wait = policy.next_wakeup(self._waits, self._clock())
        try:
            message = self._queue.get(timeout=wait if max_wait is None else min(wait, max_wait))
        except queue.Empty:
            return None
        self._handle(message)
        while True:  # drain what else arrived: one reconcile for a burst
            try:
                self._handle(self._queue.get_nowait())
            except queue.Empty:
                return None

    def close(self) -> None:
        """Stop the chaos, the shards and every worker; close the store."""
        self._stop.set()
        for component in (self._chaos, self._ps):
            if component is not None:
                component.stop()
        stop_all([self._processes[r.worker_id] for r in self.workers.values()
                  if r.state.running], STOP_GRACE)
        if self.store is not None:
            self.store.close()
        if self._server is not None:
            self._server.stop()

    # ------------------------------------------------------------------ setup
    def _follow_store(self) -> None:
        store = self._require_store()
        revision = store.revision()
        for prefix, on_event, on_resync in (
                (self.keys.workers, RegistryChanged, RegistryResync),
                (self.keys.failures, FailureReport, FailureResync)):
            watch = store.watch_prefix(prefix, start_revision=revision + 1)
            self._spawn(f"watch-{prefix}", follow_prefix, store, prefix, watch,
                        on_event=lambda e, m=on_event: self.post(m(e)),
                        on_resync=lambda kvs, m=on_resync: self.post(m(list(kvs))),
                        on_lost=lambda exc: self.post(StoreLost(
                            f"{exc} (for more than --elastic-timeout "
                            f"{self.config.elastic_timeout:g}s)")), stop=self._stop,
                        patience=self.config.elastic_timeout, clock=self._clock)
        if self.config.uses_discovery:
            self._spawn("discovery", self._poll_discovery)

    def _make_ps_supervisor(self) -> PSSupervisor:
        cfg = self.config
        bind = "127.0.0.1" if self.all_local else self.advertised_host
        return PSSupervisor(shard_commands(cfg, bind), job_env(cfg, self.secret, self.store_url),
                            store=self._require_store(), keys=self.keys,
                            launcher=self._launcher, events=self.events,
                            on_fatal=lambda reason: self.post(Fatal(reason)),
                            ready_timeout=cfg.start_timeout,
                            store_patience=cfg.elastic_timeout, clock=self._clock)

    def _spawn(self, name: str, target: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        threading.Thread(target=target, args=args, kwargs=kwargs, name=name, daemon=True).start()

    def _poll_discovery(self) -> None:
        while not self._stop.wait(self.config.discovery_interval):
            try:
                self.post(HostsFound(self.discovery.find_hosts()))
            except DiscoveryError as exc:
                self.post(DiscoveryFailed(str(exc)))

    def _require_store(self) -> KVStore:
        if self.store is None:
            raise JobFailed("the rendezvous store is not open")
        return self.store

    # ------------------------------------------------------------------ decisions
    def _reconcile(self) -> None:
        now = self._clock()
        self._emit_host_events(self.hosts.release_expired(now))
        view = policy.HostsView.of(self.hosts)
        self._waits = []
        self._apply(policy.hosts_rule(self.workers, self.plan, self.book, view, self.config, now))
        self._apply(policy.workers_to_stop(self.workers, view.usable))
        self._apply(policy.workers_to_kill(self.workers, now))
        self._apply(policy.lapse_waits(self.workers))
        self._apply(policy.slots_to_fill(self.workers, view.usable, self.book, self.config))
        decisions, self.book = policy.plan_round(self.workers, self.plan, self.book, view,
                                                 self.config, now)
        self._apply(decisions)

    def _settle(self) -> int | None:
        decision = policy.outcome(self.workers, self.plan, self.book)
        if isinstance(decision, policy.Fail):
            raise JobFailed(decision.reason)
        if isinstance(decision, policy.Succeed):
            self.events.emit(JobDone(round=decision.round, size=decision.size,
                                     resets=decision.resets))
            return 0
        return None

    def _apply(self, decisions: Sequence[Decision]) -> None:
        for decision in decisions:
            _DECISIONS[type(decision)](self, decision)

    def _end(self, reason: str) -> None:
        raise JobFailed(reason)

    def _publish(self, decision: policy.Publish) -> None:
        plan = decision.plan
        self._require_store().put(self.keys.round, plan.to_json())
        self.plan = plan
        for worker_id, process in self._processes.items():
            member = plan.member(worker_id)
            process.rank = member.rank if member is not None else None
        self.events.emit(RoundFormed(round=plan.round_id, size=plan.size,
                                     seconds=decision.seconds, members=list(plan.worker_ids)))
        # Reports about older rounds are settled by this one.
        self._delete_quietly(self.keys.failures)

    def _kill(self, decision: policy.Kill, chaos: bool = False) -> None:
        rec = self.workers.get(decision.worker_id)
        if rec is None or not rec.state.running:
            return
        log.info("killing worker %s: %s", rec.worker_id, decision.reason)
        self._processes[rec.worker_id].kill()
        now = self._clock()
        self.workers[rec.worker_id] = workers.killed(rec, now, chaos=chaos)
        if self.plan is not None and self.plan.member(rec.worker_id) is not None:
            self.book = self.book.changed(now)

    def _stop_worker(self, decision: policy.Stop) -> None:
        rec = self.workers[decision.worker_id]
        self.workers[rec.worker_id] = workers.stopping(rec, self._clock())
        self.events.emit(WorkerStopping(worker=rec.worker_id, host=rec.host, slot=rec.slot,
                                        reason=decision.reason))
        self._spawn(f"stop-{rec.worker_id}", self._processes[rec.worker_id].stop, STOP_GRACE)

    def _launch(self, decision: policy.Launch) -> None:
        host, slot = decision.host, decision.slot
        self._launch_seq += 1
        worker_id = worker_id_for(host, slot, self._launch_seq)
        bind = "127.0.0.1" if self.all_local else (
            self.advertised_host if is_local_host(host) else host)
        spec = worker_spec(self.config, self.secret, self.store_url, worker_id, host, slot, bind)
        try:
            process = self._launcher.launch(spec)
        except LauncherError as exc:
            self.events.emit(WorkerFailed(worker=worker_id, host=host, slot=slot, code=None,
                                          reason=f"launch failed: {exc}"))
            self._emit_host_events(self.hosts.record_failure(host, self._clock()))
            return
        self.workers[worker_id] = WorkerRecord.launched(worker_id, host, slot, self._clock())
        self._processes[worker_id] = process
        self.events.emit(WorkerStarted(worker=worker_id, host=host, slot=slot, pid=process.pid))
        self._spawn(f"wait-{worker_id}", self._wait_exit, worker_id, process)

    def _wait_exit(self, worker_id: str, process: WorkerProcess) -> None:
        code = process.wait(timeout=None)
        self.post(ProcessExited(worker_id, code if code is not None else -1))

    # ------------------------------------------------------------------ messages
    def _handle(self, message: Message) -> None:
        _MESSAGES[type(message)](self, message)

    def _on_exit(self, message: ProcessExited) -> None:
        rec = self.workers[message.worker_id]
        if rec.info is not None:
            # Do not wait for its lease: the process is gone.
            self._delete_quietly(self.keys.worker(rec.worker_id))
        self.workers[rec.worker_id], (decisions, self.book) = policy.worker_exited(
            rec, message.code, self.plan, self.book, self._clock())
        self._apply(decisions)

    def _count_failure(self, decision: policy.CountFailure) -> None:
        self._emit_host_events(self.hosts.record_failure(decision.host, self._clock()))
        decisions, self.book = policy.count_failure(self.book, self.hosts.available_slots,
                                                    decision.code)
        self._apply(decisions)

    def _on_registry(self, message: RegistryChanged) -> None:
        event: Event = message.event
        self._set_registration(event.key[len(self.keys.workers):],
                               event.kv if event.type == PUT else None)

    def _on_registry_resync(self, message: RegistryResync) -> None:
        """The registrations as read afresh after the registry watch was lost."""
        registered = {kv.key[len(self.keys.workers):]: kv for kv in message.kvs}
        for rec in list(self.workers.values()):
            if rec.state.running and (rec.worker_id in registered or rec.info is not None):
                self._set_registration(rec.worker_id, registered.get(rec.worker_id))

    def _set_registration(self, worker_id: str, kv: KeyValue | None) -> None:
        """Worker ``worker_id`` is registered as ``kv``, or no longer (None)."""
        rec = self.workers.get(worker_id)
        if rec is None or not rec.state.running:
            return
        now = self._clock()
        self.workers[worker_id] = (
            workers.registered(rec, WorkerInfo.from_json(kv.value), kv.create_revision, now)
            if kv is not None else workers.unregistered(rec, now))
        self.book = self.book.changed(now)

    def _on_failure_report(self, message: FailureReport) -> None:
        if message.event.type != PUT:
            return
        report = json.loads(message.event.value)
        suspect = report.get("suspect")
        self.events.emit(FailureReported(reporter=report.get("worker_id"),
                                         round=report.get("round_id"),
                                         reason=report.get("reason"), suspect=suspect))
        kill = policy.unresponsive(self.workers, self.plan, suspect, report.get("round_id"))
        if kill is not None:
            self._kill(kill)

    def _on_chaos_tick(self, message: ChaosTick) -> None:
        candidates = policy.chaos_candidates(self.workers, self.plan, self.book)
        victim = self._chaos.strike(candidates) if self._chaos and candidates else None
        if victim is None or self._chaos is None:
            return
        rec, process = self.workers[victim], self._processes[victim]
        self.events.emit(ChaosKill(worker=victim, host=rec.host, slot=rec.slot,
                                   rank=self._rank_of(victim), pid=process.pid,
                                   kill=self._chaos.kills))
        self._kill(policy.Kill(victim, "chaos"), chaos=True)

    # ------------------------------------------------------------------ helpers
    def _emit_host_events(self, host_events: Sequence[HostEvent]) -> None:
        for host_event in host_events:
            self.events.emit(host_event)
        if host_events:
            self.book = self.book.changed(self._clock())

    def _rank_of(self, worker_id: str) -> int | None:
        member = self.plan.member(worker_id) if self.plan is not None else None
        return member.rank if member is not None else None

    def _delete_quietly(self, key: str) -> None:
        try:
            store = self._require_store()
            if key.endswith("/"):
                store.delete_prefix(key)
            else:
                store.delete(key)
        except RendezvousError as exc:
            log.debug("could not delete %s: %s", key, exc)



_DECISIONS: dict[type, Callable[[Job, Any], None]] = {
    policy.Publish: Job._publish,
    policy.Wait: lambda job, d: job._waits.append(d),
    policy.Fail: lambda job, d: job._end(d.reason),
    policy.Kill: Job._kill,
    policy.Stop: Job._stop_worker,
    policy.Launch: Job._launch,
    policy.Report: lambda job, d: job.events.emit(d.event),
    policy.CountFailure: Job._count_failure,
}

_MESSAGES: dict[type, Callable[[Job, Any], None]] = {
    ProcessExited: Job._on_exit,
    RegistryChanged: Job._on_registry,
    RegistryResync: Job._on_registry_resync,
    FailureReport: Job._on_failure_report,
    # Missed reports are hints superseded by process exits: nothing to catch up on.
    FailureResync: lambda job, m: None,
    HostsFound: lambda job, m: job._emit_host_events(job.hosts.update(m.hosts, job._clock())),
    DiscoveryFailed: lambda job, m: job.events.emit(HostDiscoveryFailed(error=m.error)),
    SignalReceived: lambda job, m: job._end(f"stopped by {signal.Signals(m.signum).name}; "
                                            "all workers were stopped"),
    StoreLost: lambda job, m: job._end(f"lost the rendezvous store: {m.reason}"),
    KillRequested: lambda job, m: job._kill(policy.Kill(m.worker_id, m.reason)),
    ChaosTick: Job._on_chaos_tick,
    Fatal: lambda job, m: job._end(m.reason),
}
