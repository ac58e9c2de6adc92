"""The driver's main loop: launch workers, follow them, publish rounds, end the job.

One thread owns all state (``Job.run``); everything else only posts messages
(``driver.messages``) to its queue: worker exits (a waiter thread per process),
registrations, failure reports and rank 0's progress (store watches), discovery
results (a polling thread), signals, chaos ticks, a ps shard that cannot go on, a
claim on the job id lost to another driver (``driver.feeds``, ``driver.claim``). (The
store's health probe alone reports by itself: the loop may be what waits on the
store.) After
each message the loop reconciles: it asks the rules of ``driver.policy`` what to do
(stop displaced workers, kill hung ones, fill free slots, publish the next round, wait,
give up) and carries the decisions (``driver.decisions``) out. The rules are pure
functions; this module is the I/O around them: the store, the processes, the event
log, the clock.

A dead worker is noticed by whichever comes first: its process exit (the launcher),
its registration lease expiring, or a peer's failure report naming it.

``Job(config, launcher=..., events=..., clock=..., discovery=...)`` takes what it
drives, so tests run the whole loop with fake processes and a fake clock; ``run()``
is ``open()``, ``turn()`` until the job ends, ``close()``. ``open()`` claims the job id
(``driver.claim``); ``close()`` leaves nothing of the job in the store.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable

from driver import decisions as dec
from driver import events as ev
from driver import feeds, policy, workers
from driver import messages as msg
from driver.chaos import ChaosMonkey
from driver.claim import DriverClaim, new_record
from driver.config import JobConfig
from driver.discovery import FixedDiscovery, HostDiscovery, ScriptDiscovery, is_local_host
from driver.errors import (
    DiscoveryError,
    EventLogError,
    JobFailed,
    LauncherError,
    LaunchError,
    UsageError,
)
from driver.eventlog import EventLog
from driver.hosts import HostManager
from driver.launch.launchers import Launcher, get_launcher
from driver.launch.process import STOP_GRACE, WorkerProcess, stop_all
from driver.launch.spec import ssh_settings_from_env
from driver.probe import probe
from driver.ps_supervisor import PSSupervisor
from driver.wiring import (
    driver_address,
    job_env,
    open_job_store,
    quick_store,
    shard_commands,
    worker_bind_host,
    worker_id_for,
    worker_spec,
)
from driver.workers import WorkerRecord
from rendezvous.auth import make_secret
from rendezvous.embedded import EmbeddedServer
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.plan import Plan, ProgressRecord, PSConfigRecord, WorkerInfo
from rendezvous.store import PUT, KeyValue, KVStore

log = logging.getLogger(__name__)


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
        if config.log_dir:
            try:
                os.makedirs(config.log_dir, exist_ok=True)
            except OSError as exc:
                raise UsageError(
                    f"--log-dir {config.log_dir}: cannot create it: {exc.strerror or exc}"
                ) from None
        if events is None:
            try:
                events = EventLog(config.events_file, verbose=config.verbosity > 0, timestamps=True)
            except EventLogError as exc:
                raise UsageError(f"--events: {exc}") from None
        if launcher is None:
            launcher = get_launcher(config.launcher, ssh_settings=ssh_settings_from_env(os.environ))
        if discovery is None:
            script = config.discovery_script
            discovery = (
                ScriptDiscovery(script, config.slots_per_host)
                if script
                else FixedDiscovery(config.hosts)
            )
        self.config = config
        self.events = events
        self.discovery = discovery
        self.keys = JobKeys(config.job_id)
        self.secret = make_secret()
        self.hosts = HostManager(config.blacklist_policy, config.min_np, config.max_np)
        # Every process of the job runs on this machine: with --launcher local (host names
        # are then only labels, and need not resolve), or when every fixed host is this
        # machine. Everything then binds and advertises loopback.
        self.all_local = config.launcher == "local" or (
            not config.uses_discovery and all(is_local_host(h.host) for h in config.hosts)
        )
        self._launcher = launcher
        self._clock = clock
        self._queue: queue.Queue[msg.Message] = queue.Queue()
        self._stop = threading.Event()
        self._signalled: list[int] = []  # SIGINT/SIGTERM received (``post``)
        self._wake = threading.Event()  # a signal, or the ps shards' start is over
        self.workers: dict[str, WorkerRecord] = {}
        self._processes: dict[str, WorkerProcess] = {}
        self._launch_seq = 0
        self.plan: Plan | None = None
        self.book = dec.Book(started_at=clock())
        self._waits: list[dec.Wait] = []
        self._server: EmbeddedServer | None = None
        self.store: KVStore | None = None
        self.store_url = ""
        self._ps: PSSupervisor | None = None
        self._chaos: ChaosMonkey | None = None
        self._claim: DriverClaim | None = None
        self._probe: KVStore | None = None  # the store's health probe's own client
        self.advertised_host = "127.0.0.1"  # how the hosts reach the driver (set by open)

    def post(self, message: msg.Message) -> None:
        """Hand a message to the main loop (thread-safe)."""
        if isinstance(message, msg.SignalReceived):
            self._signalled.append(message.signum)
            self._wake.set()  # open() may be waiting for the ps shards
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
        except (JobFailed, DiscoveryError, RendezvousError) as exc:
            rounds = self.plan.round_id if self.plan else 0
            seconds = round(self._clock() - self.book.started_at, 3)
            self.events.emit(ev.JobFailure(reason=str(exc), rounds=rounds, seconds=seconds))
            raise
        finally:
            self.close()

    def open(self) -> None:
        """Find the hosts, open the store, claim the job id, follow the store, start the
        ps shards and the chaos.

        Raises:
            DiscoveryError: the first host discovery failed.
            RendezvousError: the store cannot be opened.
            JobIdInUseError: another driver leads a job of this id.
            JobFailed: the ps shards did not come up.
            LauncherError: a ps shard cannot be started.
        """
        cfg = self.config
        hosts = self.discovery.find_hosts()  # an error at start is fatal (DiscoveryError)
        self.advertised_host = "127.0.0.1" if self.all_local else driver_address(cfg, hosts)
        self._server, store, self.store_url = open_job_store(
            cfg, self.secret, self.all_local, self.advertised_host
        )
        self.store = store
        # Refused (JobIdInUseError) while another driver leads a job of this id.
        self._claim = DriverClaim.take(
            store, self.keys, new_record(), on_taken=lambda reason: self.post(msg.Fatal(reason))
        )
        # First in the run's events (right after the store, whose URL it names): several
        # runs may append to one events file, and this line is where each begins.
        command = list(cfg.command)
        started = ev.JobStarted(cfg.job_id, self.store_url, cfg.np, cfg.min_np, cfg.max_np, command)
        self.events.emit(started)
        # Before any worker starts: a ps client of a job without shards fails at once.
        store.put(self.keys.ps_config, PSConfigRecord(cfg.num_ps, cfg.ps_mode).to_json())
        feeds.follow_workers_and_failures(
            store, self.keys, self.post, self._stop, cfg.elastic_timeout, self._clock
        )
        self._probe = quick_store(self.store_url, self.secret)
        feeds.probe_store(self._probe, self.events.emit, self._stop)
        if cfg.uses_discovery:
            feeds.poll_discovery(self.discovery, cfg.discovery_interval, self.post, self._stop)
        self._emit_host_events(self.hosts.update(hosts, self._clock()))
        if cfg.num_ps:
            self._ps = PSSupervisor(
                shard_commands(cfg, "127.0.0.1" if self.all_local else self.advertised_host),
                job_env(cfg, self.secret, self.store_url),
                store=store,
                keys=self.keys,
                launcher=self._launcher,
                events=self.events,
                on_fatal=lambda reason: self.post(msg.Fatal(reason)),
                ready_timeout=cfg.start_timeout,
                store_patience=cfg.elastic_timeout,
                clock=self._clock,
            )
            self._start_shards(self._ps)
        if cfg.chaos_kill_interval:
            tick = functools.partial(self.post, msg.ChaosTick())
            self._chaos = ChaosMonkey(cfg.chaos_kill_interval, cfg.chaos_max_kills, tick)
            self._chaos.start()

    def _start_shards(self, supervisor: PSSupervisor) -> None:
        """Start the ps shards and wait until they serve (up to ``--start-timeout``) in a
        helper thread, so that SIGINT or SIGTERM ends the wait at once: the loop that
        handles signals does not run yet.

        Raises:
            JobFailed: the shards did not come up, or a signal came first.
            LauncherError: a shard cannot be started.
        """
        ended: list[BaseException | None] = []

        def start() -> None:
            try:
                supervisor.start()
                ended.append(None)
            except BaseException as exc:  # noqa: BLE001  (handed to the waiting thread)
                ended.append(exc)
            finally:
                self._wake.set()

        self._spawn("ps-start", start)
        # The supervisor has its own deadline; this one only guards against a bug there.
        self._wake.wait(self.config.start_timeout + 2 * STOP_GRACE)
        if self._signalled:
            raise JobFailed(
                f"stopped by {_signal_name(self._signalled[0])} while the ps shards started; "
                "all workers were stopped"
            )
        if not ended:
            raise JobFailed(f"ps shards not ready within {self.config.start_timeout:g}s")
        if ended[0] is not None:
            raise ended[0]

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
        """Stop the chaos, the shards and every worker; delete the job's keys and end
        the driver's lease (when this driver holds the job id); close the store."""
        self._stop.set()
        for component in (self._chaos, self._ps):
            if component is not None:
                component.stop()
        running = [r.worker_id for r in self.workers.values() if r.state.running]
        stop_all([self._processes[worker_id] for worker_id in running], STOP_GRACE)
        if self._claim is not None:
            self._release_claim(self._claim)
        for client in (self._probe, self.store):
            if client is not None:
                client.close()
        if self._server is not None:
            self._server.stop()

    def _release_claim(self, claim: DriverClaim) -> None:
        """Leave nothing in the store: the job's keys and the driver's lease, through a
        client whose calls give up within seconds (the job is over; an unreachable
        store must not hold its end)."""
        cleaner = quick_store(self.store_url, self.secret)
        try:
            claim.release(cleaner)
        except RendezvousError as exc:
            log.warning("could not delete the job's keys from the store: %s", exc)
        finally:
            cleaner.close()

    # ------------------------------------------------------------------ decisions
    def _reconcile(self) -> None:
        now, records, cfg = self._clock(), self.workers, self.config
        self._emit_host_events(self.hosts.release_expired(now))
        view = dec.HostsView.of(self.hosts)
        self._waits = []
        self._apply(policy.hosts_rule(records, self.plan, self.book, view, cfg, now))
        self._apply(policy.workers_to_stop(records, view.usable))
        self._apply(policy.workers_to_kill(records, now))
        self._apply(policy.lapse_waits(records))
        self._apply(policy.slots_to_fill(records, view.usable, self.book, cfg))
        self._step(policy.no_hosts(self.book, view, cfg, now))
        self._step(policy.progress_report(self.book, self.plan, cfg, now))
        self._step(policy.plan_round(records, self.plan, self.book, view, cfg, now))

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
        plan = decision.plan
        self._require_store().put(self.keys.round, plan.to_json())
        self.plan = plan
        for worker_id, process in self._processes.items():
            member = plan.member(worker_id)
            process.rank = member.rank if member is not None else None
        members = list(plan.worker_ids)
        self.events.emit(ev.RoundFormed(plan.round_id, plan.size, decision.seconds, members))
        # Reports about older rounds are settled by this one.
        self._delete_quietly(self.keys.failures)

    def _kill(self, decision: dec.Kill) -> None:
        rec = self.workers.get(decision.worker_id)
        if rec is None or not rec.state.running:
            return
        log.info("killing worker %s: %s", rec.worker_id, decision.reason)
        self._processes[rec.worker_id].kill()
        now = self._clock()
        self.workers[rec.worker_id] = workers.killed(
            rec, now, chaos=decision.chaos, reason=decision.reason
        )
        if self.plan is not None and self.plan.member(rec.worker_id) is not None:
            self.book = self.book.changed(now)

    def _stop_worker(self, decision: dec.Stop) -> None:
        rec = self.workers[decision.worker_id]
        self.workers[rec.worker_id] = workers.stopping(rec, self._clock())
        self._spawn(f"stop-{rec.worker_id}", self._processes[rec.worker_id].stop, STOP_GRACE)

    def _launch(self, decision: dec.Launch) -> None:
        host, slot = decision.host, decision.slot
        self._launch_seq += 1
        worker_id = worker_id_for(host, slot, self._launch_seq)
        bind = worker_bind_host(host, self.all_local, self.advertised_host)
        spec = worker_spec(self.config, self.secret, self.store_url, worker_id, host, slot, bind)
        try:
            process = self._launcher.launch(spec)
        except LauncherError as exc:
            permanent = isinstance(exc, LaunchError) and exc.permanent
            self._apply(
                policy.launch_failed(
                    worker_id, host, slot, str(exc), None, self._any_registered(), permanent
                )
            )
            return
        self.workers[worker_id] = WorkerRecord.launched(worker_id, host, slot, self._clock())
        self._processes[worker_id] = process
        self.events.emit(ev.WorkerStarted(worker_id, host, slot, process.pid))
        self._spawn(f"wait-{worker_id}", self._wait_exit, worker_id, process)

    def _wait_exit(self, worker_id: str, process: WorkerProcess) -> None:
        code = process.wait(timeout=None)
        self.post(msg.ProcessExited(worker_id, code if code is not None else -1))

    def _probe_host(self, decision: dec.Probe) -> None:
        def ask() -> None:
            result = probe(decision.address)
            self.post(msg.ProbeAnswered(decision.host, result.reachable, result.detail))

        self._spawn(f"probe-{decision.host}", ask)

    def _host_lost(self, decision: dec.HostLost) -> None:
        self._emit_host_events(self.hosts.host_lost(decision.host, self._clock()))

    def _count_failure(self, decision: dec.CountFailure) -> None:
        self._emit_host_events(self.hosts.record_failure(decision.host, self._clock()))
        slots = self.hosts.available_slots
        decisions, self.book = policy.count_failure(
            self.book, slots, decision.code, decision.reason
        )
        self._apply(decisions)

    # ------------------------------------------------------------------ messages
    def _handle(self, message: msg.Message) -> None:
        _MESSAGES[type(message)](self, message)

    def _on_exit(self, message: msg.ProcessExited) -> None:
        rec = self.workers[message.worker_id]
        if rec.info is not None:
            # Do not wait for its lease: the process is gone.
            self._delete_quietly(self.keys.worker(rec.worker_id))
        self.workers[rec.worker_id], (decisions, self.book) = policy.worker_exited(
            rec,
            message.code,
            self.plan,
            self.book,
            self._clock(),
            command=self.config.command,
            any_registered=self._any_registered(),
        )
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
        if kv is None:
            self.workers[worker_id] = workers.unregistered(rec, now)
        else:
            info = WorkerInfo.from_json(kv.value)
            self.workers[worker_id] = workers.registered(rec, info, kv.create_revision, now)
        self.book = self.book.changed(now)

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
            self._apply(policy.failure_reported(self.workers, self.plan, report))

    def _on_probe_answered(self, message: msg.ProbeAnswered) -> None:
        decisions, self.book = policy.probe_answered(
            self.workers, self.book, message.host, message.reachable, message.detail
        )
        self._apply(decisions)

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
        candidates = policy.chaos_candidates(self.workers, self.plan, self.book)
        victim = self._chaos.strike(candidates) if self._chaos and candidates else None
        if victim is not None and self._chaos is not None:
            pid, kills = self._processes[victim].pid, self._chaos.kills
            self._apply(policy.chaos_kill(self.workers[victim], self.plan, pid, kills))

    # ------------------------------------------------------------------ helpers
    def _emit_host_events(self, host_events: Sequence[ev.HostEvent]) -> None:
        for host_event in host_events:
            self.events.emit(host_event)
        if host_events:
            self.book = self.book.changed(self._clock())

    def _spawn(self, name: str, target: Callable[..., Any], *args: Any) -> None:
        threading.Thread(target=target, args=args, name=name, daemon=True).start()

    def _any_registered(self) -> bool:
        """A worker of this job has registered: its program can start."""
        return any(r.ever_registered for r in self.workers.values())

    def _require_store(self) -> KVStore:
        if self.store is None:
            raise JobFailed("the rendezvous store is not open")
        return self.store

    def _delete_quietly(self, key: str) -> None:
        try:
            store = self._require_store()
            if key.endswith("/"):
                store.delete_prefix(key)
            else:
                store.delete(key)
        except RendezvousError as exc:
            log.debug("could not delete %s: %s", key, exc)


def _signal_name(signum: int) -> str:
    return signal.Signals(signum).name


_DECISIONS: dict[type, Callable[[Job, Any], object]] = {
    dec.Publish: Job._publish,
    dec.Wait: lambda job, d: job._waits.append(d),
    dec.Fail: lambda job, d: job._end(d.reason),
    dec.Kill: Job._kill,
    dec.Stop: Job._stop_worker,
    dec.Launch: Job._launch,
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
    # Missed reports are hints superseded by process exits: nothing to catch up on.
    msg.FailureResync: lambda job, m: None,
    msg.HostsFound: lambda job, m: job._emit_host_events(job.hosts.update(m.hosts, job._clock())),
    msg.DiscoveryFailed: lambda job, m: job.events.emit(ev.HostDiscoveryFailed(m.error)),
    msg.SignalReceived: lambda job, m: job._end(
        f"stopped by {_signal_name(m.signum)}; all workers were stopped"
    ),
    msg.StoreLost: lambda job, m: job._end(f"lost the rendezvous store: {m.reason}"),
    msg.ProgressReported: Job._on_progress,
    msg.KillRequested: lambda job, m: job._kill(dec.Kill(m.worker_id, m.reason)),
    msg.ChaosTick: Job._on_chaos_tick,
    msg.Fatal: lambda job, m: job._end(m.reason),
}
