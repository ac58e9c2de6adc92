"""The driver's main loop: launch workers, follow them, publish rounds, end the job.

One thread owns all state (``Job.run``); everything else only posts messages to its
queue: worker exits (a waiter thread per process), registrations and failure reports
(store watches), discovery results (a polling thread), signals, chaos kills. After each
message the loop reconciles: stop displaced workers, fill free slots, publish the next
plan when the membership changed, and check the job's deadlines. Decisions are the
pure functions of ``planner`` and ``hosts``; this module does the I/O around them.

A dead worker is noticed by whichever comes first: its process exit (the launcher),
its registration lease expiring, or a peer's failure report naming it.
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
from dataclasses import dataclass
from typing import Any

from driver import planner
from driver.config import JobConfig
from driver.discovery import FixedDiscovery, HostDiscovery, ScriptDiscovery, is_local_host
from driver.errors import DiscoveryError, DriverError
from driver.events import EventLog
from driver.hosts import HostManager
from driver import events as ev
from driver.launcher import (LaunchSpec, LauncherError, WorkerProcess, get_launcher,
                             ssh_settings_from_env, stop_all)
from rendezvous import env, open_store
from rendezvous.auth import make_secret
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.plan import Plan, WorkerInfo
from rendezvous.store import PUT, KVStore

log = logging.getLogger(__name__)

#: after the first ``-np`` workers registered, how long to wait for the rest of those
#: launched before the first round (so a job starting on 8 slots forms one round of 8)
FIRST_ROUND_GRACE = 1.0
#: how long a broken round may wait before a ``waiting`` event says so (a worker that
#: finishes first leaves its round broken for a moment: no need to report that)
WAITING_REPORT_AFTER = 1.0
#: after a member of the round exits 0, how long to wait before re-forming without it:
#: at the end of training the others exit too, and a round for that moment is noise
FINISH_GRACE = 2.0
#: workers launched together join in one re-form if they register within this window
JOIN_BATCH_WINDOW = 3.0
#: a worker whose registration vanished (lease expired) but whose process runs is killed
#: if it has not registered again after this long: it is hung, and its slot is refilled
REREGISTER_GRACE = 10.0
#: worker failures in a row, with no round forming, that end the job (at least this many,
#: or three per slot): the workers die before they can join, restarting will not help
FAILURE_STREAK_MIN = 10
#: SIGTERM to SIGKILL for workers the driver stops
STOP_GRACE = 5.0


class JobFailed(DriverError):
    """The job cannot succeed; the message is the one-line reason ``elastic-run`` prints."""


@dataclass
class WorkerRecord:
    worker_id: str
    host: str
    slot: int
    process: WorkerProcess
    launched_at: float
    info: WorkerInfo | None = None      # set while registered
    registered_seq: int = 0             # order of registration (planner wants it)
    exit_code: int | None = None
    stopping: bool = False              # the driver is stopping it: its exit is no failure
    unregistered_at: float | None = None  # its registration vanished while it runs
    chaos_victim: bool = False          # killed by --chaos-kill-interval: not its host's fault

    @property
    def running(self) -> bool:
        return self.exit_code is None


@dataclass
class _Message:
    kind: str
    data: Any = None


def job_env(config: JobConfig, secret: str, store_url: str) -> dict[str, str]:
    """What every process of the job (worker or ps shard) is told about it (pure)."""
    return {env.ENV_RENDEZVOUS: store_url, env.ENV_JOB_ID: config.job_id,
            env.ENV_SECRET: secret,
            # The etcd client needs it before protobuf loads, whatever the script imports first.
            "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python",
            # Output is forwarded line by line: do not let Python hold it back.
            "PYTHONUNBUFFERED": os.environ.get("PYTHONUNBUFFERED", "1")}


def worker_env(config: JobConfig, secret: str, store_url: str, worker_id: str, host: str,
               slot: int, bind_host: str) -> dict[str, str]:
    """The job's own variables for one worker (pure); they are added to the inherited ones."""
    return {**job_env(config, secret, store_url), env.ENV_WORKER_ID: worker_id,
            env.ENV_HOST: host, env.ENV_SLOT: str(slot), env.ENV_BIND_HOST: bind_host,
            env.ENV_ROUND_TIMEOUT: str(config.elastic_timeout)}


class Job:
    """One run of ``elastic-run``. ``run()`` returns the exit status."""

    def __init__(self, config: JobConfig, events: EventLog | None = None):
        self.config = config
        self.events = events or EventLog(config.events_file, verbose=config.verbosity > 0)
        self.keys = JobKeys(config.job_id)
        self.secret = make_secret()
        self.hosts = HostManager(config.blacklist_policy, config.min_np, config.max_np)
        self.discovery: HostDiscovery = (
            ScriptDiscovery(config.discovery_script, config.slots_per_host)
            if config.discovery_script else FixedDiscovery(config.hosts))
        self.all_local = not config.discovery_script and all(is_local_host(h.host)
                                                             for h in config.hosts)
        self._queue: queue.Queue[_Message] = queue.Queue()
        self._stop = threading.Event()
        self.workers: dict[str, WorkerRecord] = {}
        self._registration_seq = 0
        self._launch_seq = 0
        self.plan: Plan | None = None
        self.resets = 0
        self.done_slots: set[tuple[str, int]] = set()  # their worker finished: not refilled
        self._member_finished_at: float | None = None   # a member of the round exited 0
        self._all_failed_rounds: set[int] = set()       # rounds whose members all failed
        self._failures_since_round = 0                  # worker failures since the last round
        self._broken_since: float | None = None      # the round is broken, no plan possible yet
        self._waiting_reported = False
        self._change_at: float | None = None         # when the membership last changed
        self._np_registered_at: float | None = None
        self._started_at = time.monotonic()
        self._server = None
        self.store: KVStore | None = None
        self.store_url = ""
        self._ps = None
        self._chaos = None
        self._launcher = get_launcher(config.launcher,
                                      ssh_settings=ssh_settings_from_env(os.environ))
        if config.log_dir:
            os.makedirs(config.log_dir, exist_ok=True)

    @property
    def advertised_host(self) -> str:
        """How other machines reach this one (for servers the driver runs)."""
        return socket.getfqdn()

    def shard_env(self) -> dict[str, str]:
        return job_env(self.config, self.secret, self.store_url)

    # ------------------------------------------------------------------ setup
    def _open_store(self) -> None:
        if self.config.rendezvous.scheme == "embedded":
            from rendezvous.embedded import EmbeddedServer
            bind = "127.0.0.1:0" if self.all_local else "0.0.0.0:0"
            self._server = EmbeddedServer(self.secret, bind=bind)
            address = self._server.start()
            port = address.rsplit(":", 1)[1]
            host = "127.0.0.1" if self.all_local else self.advertised_host
            self.store_url = f"embedded://{host}:{port}"
        else:
            self.store_url = str(self.config.rendezvous)
        self.store = open_store(self.store_url, self.secret)
        # A job id names one job: keys left by an earlier job with the same id would mislead us.
        self.store.delete_prefix(self.keys.prefix)

    def _start_threads(self) -> None:
        revision = self.store.revision()
        for name, prefix in (("registry", self.keys.workers), ("failure", self.keys.failures)):
            watch = self.store.watch_prefix(prefix, start_revision=revision + 1)
            self._spawn(f"watch-{name}", self._pump_watch, watch, name, prefix)
        if self.config.discovery_script:
            self._spawn("discovery", self._poll_discovery)

    def _spawn(self, name, target, *args) -> None:
        threading.Thread(target=target, args=args, name=name, daemon=True).start()

    def _pump_watch(self, watch, kind: str, prefix: str) -> None:
        """Forward a watch's events to the main loop. When the watch ends for good (the
        store was away longer than the watch waits, or its history was compacted), read
        the prefix afresh (posted as ``<kind>_resync``) and watch on from there; only a
        store unreachable for --elastic-timeout ends the job."""
        try:
            while not self._stop.is_set():
                try:
                    event = watch.get(timeout=0.5)
                except RendezvousError as exc:
                    watch.cancel()
                    watch = self._rewatch(prefix, kind, exc)
                    if watch is None:
                        return
                    continue
                if event is not None:
                    self._queue.put(_Message(kind, event))
        finally:
            if watch is not None:
                watch.cancel()

    def _rewatch(self, prefix: str, kind: str, cause: Exception):
        log.warning("watch on %s ended (%s); reading it afresh", prefix, cause)
        deadline = time.monotonic() + self.config.elastic_timeout
        while not self._stop.is_set():
            try:
                kvs, watch = self.store.read_and_watch(prefix)
            except RendezvousError as exc:
                if time.monotonic() > deadline:
                    self._queue.put(_Message("store_lost", f"{exc} (for more than "
                                             f"--elastic-timeout {self.config.elastic_timeout:g}s)"))
                    return None
                self._stop.wait(1.0)
                continue
            self._queue.put(_Message(f"{kind}_resync", kvs))
            return watch
        return None

    def _poll_discovery(self) -> None:
        while not self._stop.wait(self.config.discovery_interval):
            try:
                self._queue.put(_Message("hosts", self.discovery.find_hosts()))
            except DiscoveryError as exc:
                self._queue.put(_Message("discovery_error", str(exc)))

    def post(self, kind: str, data: Any = None) -> None:
        """Hand a message to the main loop (thread-safe; used by signals, chaos, ps)."""
        self._queue.put(_Message(kind, data))

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        """Run the job to its end. Returns 0 on success; raises JobFailed with the reason."""
        previous_handlers = self._install_signal_handlers()
        try:
            hosts = self.discovery.find_hosts()  # an error at start is fatal (DiscoveryError)
            self._open_store()
            self._start_threads()
            self._apply_host_events(self.hosts.update(hosts, time.monotonic()))
            if self.config.num_ps:
                from driver.ps_supervisor import PSSupervisor
                self._ps = PSSupervisor(self)
                self._ps.start()
            if self.config.chaos_kill_interval:
                from driver.chaos import ChaosMonkey
                self._chaos = ChaosMonkey(self)
                self._chaos.start()
            self.events.emit(ev.JOB_STARTED, job_id=self.config.job_id, store=self.store_url,
                             np=self.config.np, min_np=self.config.min_np,
                             max_np=self.config.max_np, command=list(self.config.command))
            while True:
                self._reconcile()
                outcome = self._outcome()
                if outcome is not None:
                    return outcome
                try:
                    message = self._queue.get(timeout=self._next_wakeup())
                except queue.Empty:
                    continue
                self._handle(message)
                while True:  # drain what else arrived: one reconcile for a burst
                    try:
                        self._handle(self._queue.get_nowait())
                    except queue.Empty:
                        break
        except (JobFailed, DiscoveryError, RendezvousError) as exc:
            self.events.emit(ev.JOB_FAILED, reason=str(exc), rounds=self.plan.round_id if self.plan else 0,
                             seconds=round(time.monotonic() - self._started_at, 3))
            raise
        finally:
            self._shutdown()
            self._restore_signal_handlers(previous_handlers)

    def _next_wakeup(self) -> float:
        wake = 1.0
        release = self.hosts.next_release_time()
        if release is not None:
            wake = min(wake, max(0.01, release - time.monotonic()))
        if self._member_finished_at is not None:
            grace_left = self._member_finished_at + FINISH_GRACE - time.monotonic()
            if grace_left > 0:
                wake = min(wake, max(0.01, grace_left))
        if self.plan is None and self._np_registered_at is not None:
            wake = min(wake, max(0.01, self._np_registered_at + FIRST_ROUND_GRACE - time.monotonic()))
        return wake

    def _handle(self, message: _Message) -> None:
        kind, data = message.kind, message.data
        if kind == "exit":
            self._on_exit(*data)
        elif kind == "registry":
            self._on_registry(data)
        elif kind == "failure":
            self._on_failure_report(data)
        elif kind == "registry_resync":
            self._on_registry_resync(data)
        elif kind == "failure_resync":
            pass  # reports are hints; the ones missed are superseded by process exits
        elif kind == "hosts":
            self._apply_host_events(self.hosts.update(data, time.monotonic()))
        elif kind == "discovery_error":
            self.events.emit(ev.DISCOVERY_ERROR, error=data)
        elif kind == "signal":
            raise JobFailed(f"stopped by {signal.Signals(data).name}; all workers were stopped")
        elif kind == "store_lost":
            raise JobFailed(f"lost the rendezvous store: {data}")
        elif kind == "kill":
            self._kill_worker(*data)
        elif kind == "chaos":
            self._chaos_strike()
        elif kind == "fatal":
            raise JobFailed(data)

    # ------------------------------------------------------------------ messages
    def _on_exit(self, worker_id: str, code: int) -> None:
        rec = self.workers[worker_id]
        rec.exit_code = code
        now = time.monotonic()
        if rec.info is not None:
            # Do not wait for its lease: the process is gone.
            self._delete_quietly(self.keys.worker(worker_id))
        rec.info = None
        in_plan = self.plan is not None and self.plan.member(worker_id) is not None
        if code == 0 and not rec.stopping:
            self.events.emit(ev.WORKER_EXITED, worker=worker_id, host=rec.host, slot=rec.slot,
                             code=code, rank=self._rank_of(worker_id))
            self.done_slots.add((rec.host, rec.slot))
            if in_plan:
                self._member_finished_at = now
        elif rec.stopping:
            self.events.emit(ev.WORKER_STOPPED, worker=worker_id, host=rec.host, slot=rec.slot,
                             code=code)
        else:
            self.events.emit(ev.WORKER_FAILED, worker=worker_id, host=rec.host, slot=rec.slot,
                             code=code, rank=self._rank_of(worker_id), in_round=in_plan,
                             chaos=rec.chaos_victim)
            if not rec.chaos_victim:
                self._apply_host_events(self.hosts.record_failure(rec.host, now))
                self._failures_since_round += 1
                limit = max(FAILURE_STREAK_MIN, 3 * self.hosts.available_slots)
                if self._failures_since_round > limit:
                    raise JobFailed(f"{self._failures_since_round} workers failed in a row "
                                    "without a round forming (last exit: "
                                    f"{ev.describe_code(code)}); see the worker output above")
        if in_plan:
            self._mark_change(now)

    def _on_registry(self, event) -> None:
        worker_id = event.key[len(self.keys.workers):]
        rec = self.workers.get(worker_id)
        if rec is None or not rec.running:
            return
        if event.type == PUT:
            if rec.info is None:
                self._registration_seq += 1
                rec.registered_seq = self._registration_seq
            rec.info = WorkerInfo.from_json(event.value)
            rec.unregistered_at = None
        else:
            # Its lease expired while the process runs: not live until it registers again,
            # and killed (so its slot is refilled) if it does not within REREGISTER_GRACE.
            rec.info = None
            rec.unregistered_at = time.monotonic()
        self._mark_change(time.monotonic())

    def _mark_change(self, now: float) -> None:
        """Membership changed at ``now``: the next round's formation time counts from the
        first change it answers."""
        if self._change_at is None:
            self._change_at = now

    def _on_registry_resync(self, kvs) -> None:
        """The registrations as read afresh after the registry watch was lost."""
        registered = {kv.key[len(self.keys.workers):]: kv for kv in kvs}
        now = time.monotonic()
        for rec in self._running():
            kv = registered.get(rec.worker_id)
            if kv is not None:
                if rec.info is None:
                    self._registration_seq += 1
                    rec.registered_seq = self._registration_seq
                rec.info = WorkerInfo.from_json(kv.value)
                rec.unregistered_at = None
            elif rec.info is not None:
                rec.info = None
                rec.unregistered_at = now
        self._mark_change(now)

    def _on_failure_report(self, event) -> None:
        if event.type != PUT:
            return
        report = json.loads(event.value)
        suspect = report.get("suspect")
        self.events.emit(ev.FAILURE_REPORTED, reporter=report.get("worker_id"),
                         round=report.get("round_id"), reason=report.get("reason"),
                         suspect=suspect)
        rec = self.workers.get(suspect) if suspect else None
        current = self.plan is not None and report.get("round_id") == self.plan.round_id
        if current and rec is not None and rec.running and not rec.stopping:
            # Its peers timed out on it: it is alive but not answering (stopped, hung).
            self._kill_worker(suspect, "unresponsive (reported by its peers)")

    def _kill_worker(self, worker_id: str, reason: str) -> None:
        rec = self.workers.get(worker_id)
        if rec is not None and rec.running:
            log.info("killing worker %s: %s", worker_id, reason)
            rec.process.kill()

    def _chaos_strike(self) -> None:
        members = [m.worker_id for m in (self.plan.members if self.plan else ())
                   if self.workers[m.worker_id].running and not self.workers[m.worker_id].stopping]
        victim = self._chaos.strike(members) if self._chaos and not self.done_slots else None
        if victim is not None:
            rec = self.workers[victim]
            rec.chaos_victim = True
            self.events.emit(ev.CHAOS_KILL, worker=victim, host=rec.host, slot=rec.slot,
                             rank=self._rank_of(victim), pid=rec.process.pid,
                             kill=self._chaos.kills)
            rec.process.kill()

    def _apply_host_events(self, host_events) -> None:
        for host_event in host_events:
            self.events.emit(host_event.kind, **{k: v for k, v in host_event.as_record().items()
                                                 if k not in ("kind", "event")})
        if host_events:
            self._mark_change(time.monotonic())

    # ------------------------------------------------------------------ reconcile
    def _reconcile(self) -> None:
        now = time.monotonic()
        self._apply_host_events(self.hosts.release_expired(now))
        if self.hosts.all_blacklisted and not self._running():
            # Cooldowns end: wait for the first host to come back, unless that is later
            # than the job may wait anyway.
            if self.plan is None:
                limit, flag = self._started_at + self.config.start_timeout, "--start-timeout"
            else:
                limit = (self._broken_since or now) + self.config.elastic_timeout
                flag = "--elastic-timeout"
            release = self.hosts.next_release_time()
            if release is None or release > limit:
                raise JobFailed("every host is blacklisted after repeated worker failures ("
                                + ", ".join(self.hosts.blacklisted_hosts)
                                + f") and none comes back within {flag}")
        usable = self.hosts.usable_hosts
        self._stop_displaced(usable)
        self._kill_unregistered(now)
        self._fill_slots(usable)
        if self._member_finished_at is not None and now - self._member_finished_at < FINISH_GRACE:
            return  # the others are most likely finishing too: no round for the last moments
        self._plan_round(usable, now)

    def _running(self) -> list[WorkerRecord]:
        return [r for r in self.workers.values() if r.running]

    def _stop_displaced(self, usable) -> None:
        allowed = set(planner.allowed_slots(usable))
        for rec in self._running():
            if not rec.stopping and (rec.host, rec.slot) not in allowed:
                self._stop_worker(rec, "its host or slot left the job")

    def _kill_unregistered(self, now: float) -> None:
        for rec in self._running():
            if (rec.unregistered_at is not None and not rec.stopping
                    and now - rec.unregistered_at > REREGISTER_GRACE):
                rec.unregistered_at = None
                self._kill_worker(rec.worker_id, f"its registration lapsed and it did not "
                                                 f"register again within {REREGISTER_GRACE:g}s")

    def _stop_worker(self, rec: WorkerRecord, reason: str) -> None:
        rec.stopping = True
        self.events.emit(ev.WORKER_STOPPING, worker=rec.worker_id, host=rec.host, slot=rec.slot,
                         reason=reason)
        self._spawn(f"stop-{rec.worker_id}", rec.process.stop, STOP_GRACE)

    def _fill_slots(self, usable) -> None:
        occupied = [(r.host, r.slot) for r in self._running()]
        for host, slot in planner.slots_to_fill(usable, occupied + sorted(self.done_slots),
                                                self.config.max_np):
            self._launch(host, slot)

    def _launch(self, host: str, slot: int) -> None:
        self._launch_seq += 1
        safe_host = "".join(c if c.isalnum() or c in "-." else "_" for c in host)
        worker_id = f"{safe_host}-{slot}-{self._launch_seq}"
        local = is_local_host(host)
        bind = "127.0.0.1" if self.all_local else (self.advertised_host if local else host)
        log_path = (os.path.join(self.config.log_dir, f"{worker_id}.log")
                    if self.config.log_dir else None)
        spec = LaunchSpec(host=host, slot=slot, command=tuple(self.config.command),
                          env=worker_env(self.config, self.secret, self.store_url, worker_id,
                                         host, slot, bind),
                          cwd=os.getcwd(), label=f"{host}:{slot}", log_path=log_path)
        try:
            process = self._launcher.launch(spec)
        except LauncherError as exc:
            self.events.emit(ev.WORKER_FAILED, worker=worker_id, host=host, slot=slot,
                             code=None, reason=f"launch failed: {exc}")
            self._apply_host_events(self.hosts.record_failure(host, time.monotonic()))
            return
        rec = WorkerRecord(worker_id, host, slot, process, time.monotonic())
        self.workers[worker_id] = rec
        self.events.emit(ev.WORKER_STARTED, worker=worker_id, host=host, slot=slot,
                         pid=process.pid)
        self._spawn(f"wait-{worker_id}", self._wait_exit, rec)

    def _wait_exit(self, rec: WorkerRecord) -> None:
        code = rec.process.wait(timeout=None)
        self._queue.put(_Message("exit", (rec.worker_id, code)))

    def _rank_of(self, worker_id: str) -> int | None:
        plan = self.plan
        member = plan.member(worker_id) if plan is not None else None
        return member.rank if member is not None else None

    def _live_infos(self) -> list[WorkerInfo]:
        live = [r for r in self._running() if r.info is not None and not r.stopping]
        return [r.info for r in sorted(live, key=lambda r: r.registered_seq)]

    def _plan_round(self, usable, now: float) -> None:
        live = self._live_infos()
        cfg = self.config
        if self.plan is None:
            if len(live) < cfg.np:
                self._np_registered_at = None
                if now - self._started_at > cfg.start_timeout:
                    raise JobFailed(f"only {len(live)} of {cfg.np} workers registered within "
                                    f"--start-timeout {cfg.start_timeout:g}s")
                return
            launched = len([r for r in self._running() if not r.stopping])
            if self._np_registered_at is None:
                self._np_registered_at = now
            if len(live) < launched and now - self._np_registered_at < FIRST_ROUND_GRACE:
                return
            min_np = cfg.np
        else:
            min_np = cfg.min_np
        candidate = planner.next_plan(self.plan, live, usable, min_np, cfg.max_np)
        if planner.needs_new_round(self.plan, candidate):
            joiner_ages = [now - r.launched_at for r in self._running()
                           if r.info is None and not r.stopping]
            intact = self.plan is not None and planner.round_is_intact(self.plan, live, usable)
            if not planner.hold_growth_for_joiners(intact, joiner_ages, JOIN_BATCH_WINDOW):
                self._publish(candidate, now)
                return
        if self.plan is not None and planner.round_is_intact(self.plan, live, usable):
            self._broken_since = None  # a brief lapse (a lease renewed late) is over
        elif self.plan is not None:
            self._check_script_failed()
            if self._broken_since is None:
                self._broken_since = now
                self._waiting_reported = False
            elif not self._waiting_reported and now - self._broken_since > WAITING_REPORT_AFTER:
                self._waiting_reported = True
                self.events.emit(ev.WAITING, what=f"round {self.plan.round_id} lost workers; "
                                 f"waiting for {min_np} to re-form (have {len(live)})",
                                 waited=round(now - self._broken_since, 3))
            if now - self._broken_since > cfg.elastic_timeout:
                blacklisted = self.hosts.blacklisted_hosts
                raise JobFailed(f"no round of at least {min_np} workers could form within "
                                f"--elastic-timeout {cfg.elastic_timeout:g}s (have {len(live)}"
                                + (f"; blacklisted: {', '.join(blacklisted)}" if blacklisted
                                   else "") + ")")

    def _check_script_failed(self) -> None:
        """Every member of two rounds in a row exited with an error code of its own (no
        signal, no stop): the script fails deterministically, and replacing the workers
        again would only repeat it. (One such round is replaced as usual: with -np 1 it
        is just a failed worker.) Raises JobFailed."""
        codes = [self.workers[m.worker_id].exit_code for m in self.plan.members]
        if not (codes and all(c is not None and c > 0 for c in codes)) or any(
                self.workers[m.worker_id].stopping for m in self.plan.members):
            return
        rounds = self._all_failed_rounds
        rounds.add(self.plan.round_id)
        if self.plan.round_id - 1 in rounds:
            raise JobFailed(f"every worker of rounds {self.plan.round_id - 1} and "
                            f"{self.plan.round_id} exited with an error (codes "
                            f"{sorted(set(codes))}): the training script fails; see the "
                            "worker output above")

    def _publish(self, plan: Plan, now: float) -> None:
        if self.plan is not None and not self.done_slots:
            # (Rounds for stragglers after a member finished are not resets.)
            self.resets += 1
            if self.config.reset_limit is not None and self.resets > self.config.reset_limit:
                raise JobFailed(f"reset limit exceeded: the job re-formed {self.resets} times "
                                f"(--reset-limit {self.config.reset_limit})")
        self.store.put(self.keys.round, plan.to_json())
        took = now - (self._change_at or now)
        self.plan = plan
        for rec in self.workers.values():
            member = plan.member(rec.worker_id)
            rec.process.rank = member.rank if member is not None else None
        self._broken_since = None
        self._change_at = None
        self._failures_since_round = 0
        self.events.emit(ev.ROUND_FORMED, round=plan.round_id, size=plan.size,
                         seconds=round(took, 3),
                         members=[m.worker_id for m in plan.members])
        # Reports about older rounds are settled by this one.
        self._delete_quietly(self.keys.failures)

    def _delete_quietly(self, key: str) -> None:
        try:
            if key.endswith("/"):
                self.store.delete_prefix(key)
            else:
                self.store.delete(key)
        except RendezvousError as exc:
            log.debug("could not delete %s: %s", key, exc)

    # ------------------------------------------------------------------ the end
    def _outcome(self) -> int | None:
        """0 when every member of the current round exited 0; None while the job runs.
        Raises JobFailed when the round ended with some members finished and others
        failed (the finished ones cannot be replaced: their state is gone)."""
        if self.plan is None:
            if self.done_slots and not self._running():
                raise JobFailed("workers exited before the first round formed")
            return None
        codes = {m.worker_id: self._finish_code(self.workers[m.worker_id])
                 for m in self.plan.members}
        if any(code is None for code in codes.values()) or 0 not in codes.values():
            return None  # still running, or a round of failures that re-forming handles
        failed = [m for m in self.plan.members if codes[m.worker_id] != 0]
        if failed:
            m = failed[0]
            raise JobFailed(f"worker rank {m.rank} ({m.worker_id}) of the final round "
                            f"{self.plan.round_id} exited with {codes[m.worker_id]} "
                            "after other workers had finished")
        self.events.emit(ev.JOB_DONE, round=self.plan.round_id if self.plan else 0,
                         size=self.plan.size if self.plan else 0, resets=self.resets)
        return 0

    @staticmethod
    def _finish_code(rec: WorkerRecord) -> int | None:
        """A worker's exit code as the outcome sees it: one the driver stopped did not
        finish, whatever its code (a SIGTERM handler may well exit 0)."""
        if rec.exit_code is None or not rec.stopping:
            return rec.exit_code
        return rec.exit_code or -1

    def _shutdown(self) -> None:
        self._stop.set()
        for component in (self._chaos, self._ps):
            if component is not None:
                component.stop()
        stop_all([r.process for r in self.workers.values() if r.running], STOP_GRACE)
        if self.store is not None:
            self.store.close()
        if self._server is not None:
            self._server.stop()

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return None
        handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, lambda signum, _f: self.post("signal", signum))
        return handlers

    @staticmethod
    def _restore_signal_handlers(handlers) -> None:
        for sig, handler in (handlers or {}).items():
            signal.signal(sig, handler)
