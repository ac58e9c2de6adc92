"""Parameter-server shards under the driver (``--num-ps N``): start, watch, restart, and
with ``--ps-replicas 1`` a backup per shard and the failover to it.

Each shard is ``python -m ps.server --index I ...`` (the driver starts a command;
it never imports ``elastic``). Shards tell the driver what it needs through the store,
the one route for these facts (``driver.ps.records`` follows it):

* shard ``I`` writes its ``rendezvous.schema.ps.ShardInfo`` under ``JobKeys.ps_shard(I)``:
  ``ready=False`` while it restores a checkpoint, ``ready=True`` once it serves. A shard
  is ready for the supervisor when that record says ready *and* carries the pid of the
  process the supervisor runs as the shard, so the record of a shard that died is never
  taken for its replacement's (``ps_started``);
* the coordinating shard writes a ``CheckpointRecord`` after each complete checkpoint
  (``checkpoint_written``), and a ``CheckpointFailedRecord`` when checkpoints fail
  (``checkpoint_failed``); a shard that restored an older step than the shards had
  reached writes a ``RollbackRecord`` (``ps_rolled_back``, with the steps lost).

A shard that dies is restarted with the same arguments: it loads the newest complete
checkpoint, and clients retry until it is back. The restart is said with what it loses,
the shard's updates after the checkpoint's step, or since step 0 when it comes back
empty (``ps_restarted``). A shard dying over and over (``RestartLimits``, its backups'
deaths counted too) ends the job through ``on_fatal``: restarting cannot fix whatever
kills it. That restart policy is ``driver.policy.ps_restarts``.

With ``--ps-replicas 1`` each shard also has a backup process (the same command line
with ``--backup``; on another host than the shard when the placement has one), which
copies the shard's state and holds every update before the shard acknowledges it. The
shard's ``ReplicaRecord`` says when a backup is in step (``ps_backup_ready``). When the
shard's process dies and its record names its backup in step, the supervisor gives the
shard to the backup (``driver.ps.failover``: a compare-and-swap of the record), which
serves it at once with every acknowledged step (``ps_failed_over``), and starts a new
backup for it; without a backup in step the shard restarts from the checkpoint as
above. A backup that dies is replaced (``ps_backup_exited``).

The supervision is the job loop's and the agent's style: the threads that learn
something (the records' follower, one waiter per process) only post a message
(``driver.ps.messages``) to the supervisor's queue; one thread takes them in order and
asks the pure rules (``driver.ps.rules.decide``: the view, the message, the time) what
to do, and does it here: start a process, offer a shard to its backup through the
store, emit an event, give up.

Stopping (``stop``: the job's end, or SIGTERM/SIGINT to the driver) loses no applied
step: shard 0 is stopped first, with ``STOP_GRACE_COORDINATOR`` seconds before SIGKILL.
On SIGTERM it writes a final coordinated checkpoint that seals every shard (none
applies a push after it, so it holds the last step any worker saw applied), within
``FINAL_CHECKPOINT_TIMEOUT`` (its ``--stop-timeout``), and announces it with
``final`` set; the other shards, sealed, and the backups then stop at once. The
supervisor reads that record once more after shard 0 exits, so ``checkpoint_written``
with ``final`` is in the event log before ``stop`` returns. When shard 0 cannot write
that checkpoint it says so (``checkpoint_failed`` with ``final``), and ``stop`` returns
why the shards' last state is in no checkpoint, for the job's end to say (and so does a
shard 0 killed before it said either).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from driver.errors import JobFailed, LauncherError
from driver.events import EventSink, describe_code
from driver.hosts.shard_placement import ShardPlacement
from driver.launch.base import Launcher
from driver.launch.process import STOP_GRACE, WorkerProcess, stop_all
from driver.launch.spec import LaunchSpec
from driver.policy.ps_restarts import RestartLimits, restart_event
from driver.ps import messages as m
from driver.ps import rules
from driver.ps.command import BACKUP_FLAG, FINAL_CHECKPOINT_TIMEOUT
from driver.ps.failover import promotion
from driver.ps.messages import Handover, Role
from driver.ps.records import ShardRecords
from driver.threads import spawn
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.schema.ps import ReplicaRecord, ShardInfo
from rendezvous.store import KVStore

log = logging.getLogger(__name__)

STOP_GRACE_COORDINATOR = FINAL_CHECKPOINT_TIMEOUT + 5.0
"""SIGTERM to SIGKILL for shard 0 when the job stops: its final checkpoint's bound plus
time to exit. With ``STOP_GRACE`` for the workers after it, a stop takes at most about
30 s, what schedulers commonly allow between SIGTERM and SIGKILL."""

READY_POLL = 0.5
"""How often ``start`` looks at the clock while it waits (the clock may be injected)."""


@dataclass(frozen=True)
class ShardLaunch:
    """How the shards' processes start: shard ``i`` runs ``commands[i]`` with ``env``
    added to the driver's environment, through ``launcher`` (as slot ``i``, output
    prefixed ``[psI]``, a backup's ``[psI-backup]``), on the driver's machine; or, with a
    ``placement``, on the host and with the command line it says
    (``driver.hosts.shard_placement``: a shard whose host is lost moves)."""

    launcher: Launcher
    commands: tuple[tuple[str, ...], ...]
    env: Mapping[str, str] = field(default_factory=dict)
    placement: ShardPlacement | None = None

    @property
    def num_shards(self) -> int:
        return len(self.commands)

    def where(self) -> ShardPlacement:
        """The placement; without one, every shard on the driver's machine."""
        return self.placement or ShardPlacement(lambda index, host: self.commands[index])


@dataclass(frozen=True)
class SupervisionSettings:
    """``ready_timeout``: how long ``start`` waits for the shards; ``store_patience``:
    how long the store may be unreachable before that is fatal; ``replicas`` 1: each
    shard has a backup; ``checkpoints``: the shards write checkpoints
    (``--ps-checkpoint-dir``); ``restarts``: when the job gives up on a shard."""

    ready_timeout: float
    store_patience: float
    replicas: int = 0
    checkpoints: bool = False
    restarts: RestartLimits = field(default_factory=RestartLimits)


class PSSupervisor:
    """Runs the shards as ``launch`` says, with ``settings`` (see the module doc).

    ``store``/``keys``: where the shards' records are; ``events`` receives the ps events;
    ``on_fatal(reason)`` is called (from the supervisor's thread) when the shards cannot
    go on; ``clock`` (monotonic seconds) times the deaths and ``start``'s wait."""

    def __init__(
        self,
        launch: ShardLaunch,
        settings: SupervisionSettings,
        *,
        store: KVStore,
        keys: JobKeys,
        events: EventSink,
        on_fatal: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self._launch_with = launch
        self._placement = launch.where()
        self.settings = settings
        self._store = store
        self._keys = keys
        self._events = events
        self._on_fatal = on_fatal
        self._clock = clock
        self._view = rules.PSView.fresh(launch.num_shards, settings.replicas)
        self._inbox: queue.SimpleQueue[m.Message] = queue.SimpleQueue()
        self._processes: dict[int, WorkerProcess] = {}  # by pid, every one started or adopted
        # Held around each launch and the stop flag: a launch racing ``stop`` cannot
        # leave a process behind (either stop sees it, or it is never started).
        self._launching = threading.Lock()
        self._stopping = False
        self._settled = threading.Event()  # every shard ready, or the shards cannot go on
        self._loop: threading.Thread | None = None
        self._stop_lock = threading.Lock()
        self._stopped: list[str | None] = []  # ``stop``'s answer, once it returned
        # Each action the rules return, by its type, to the method that carries it out.
        self._doers: dict[type, Callable[[Any], None]] = {
            rules.Emit: self._emit,
            rules.Launch: self._relaunch,
            rules.TryFailOver: self._offer,
            rules.GiveUp: self._give_up,
        }
        self._records = ShardRecords(
            store,
            keys,
            events,
            post=self._inbox.put,
            patience=settings.store_patience,
            clock=clock,
        )

    def primary_pid(self, index: int) -> int | None:
        """The pid of the process serving shard ``index`` (as far as the supervisor has
        taken in its news)."""
        return self._view.shards[index].primary_pid

    def backup_pid(self, index: int) -> int | None:
        return self._view.shards[index].backup_pid

    # ---- lifecycle ----
    def start(self) -> None:
        """Follow the shards' records, start every shard (and backup), and wait until
        each serves (and each backup is in step).

        Raises:
            JobFailed: a shard is not ready within ``ready_timeout``, or the shards
                cannot go on (the ``on_fatal`` reason).
            LauncherError: a shard cannot be started.
        """
        self._begin()
        hosts = {i: self._start_process(i, Role.PRIMARY, None, "") for i in self._indices()}
        for index in self._indices() if self.settings.replicas else ():
            self._start_process(index, Role.BACKUP, None, hosts[index] or "")
        deadline = self._clock() + self.settings.ready_timeout
        while not self._settled.is_set():
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            self._settled.wait(min(remaining, READY_POLL))
        view = self._view
        if view.fatal is not None:
            raise JobFailed(view.fatal)
        missing = view.not_ready()
        if missing:
            what = "ps shards (and their backups)" if self.settings.replicas else "ps shards"
            raise JobFailed(
                f"{what} {missing} not ready within "
                f"{self.settings.ready_timeout:g}s (see their output above)"
            )

    def adopt(
        self,
        running: Mapping[int, WorkerProcess],
        backups: Mapping[int, WorkerProcess] | None = None,
    ) -> None:
        """Supervise shards (and backups) a driver that led the job before started
        (``running``, ``backups``, by index: the handles their agent's records gave) as
        if this one had: follow their records and checkpoints, restart them when they
        die; start the missing ones (without waiting for them: clients retry until they
        serve).

        Raises:
            LauncherError: a missing shard cannot be started.
        """
        self._begin()
        for index in self._indices():
            proc = running.get(index)
            if proc is None:
                host = self._start_process(index, Role.PRIMARY, None, "")
            else:
                self._take_over(index, Role.PRIMARY, proc)
                host = proc.spec.host
            backup = (backups or {}).get(index)
            if backup is not None:
                self._take_over(index, Role.BACKUP, backup)
            elif self.settings.replicas:
                self._start_process(index, Role.BACKUP, None, host or "")

    def stop(self, coordinator_grace: float = STOP_GRACE_COORDINATOR) -> str | None:
        """Stop every shard: shard 0 first (SIGTERM: its final checkpoint, SIGKILL after
        ``coordinator_grace`` seconds), then the others and the backups
        (``STOP_GRACE``); report the final checkpoint (``checkpoint_written`` or
        ``checkpoint_failed`` with ``final``). Returns why the shards' last state is
        in no checkpoint (shard 0 said it could not write it, or was killed before it
        said anything), None when it is or there is nothing to say. A second call
        returns the first one's answer."""
        with self._stop_lock:
            if not self._stopped:
                self._stopped.append(self._stop(coordinator_grace))
            return self._stopped[0]

    def _stop(self, coordinator_grace: float) -> str | None:
        with self._launching:
            self._stopping = True
        if self._loop is not None:
            # Every launch posted its news before the flag was set: once the loop took
            # ``Stop``, the view names every process there is.
            self._inbox.put(m.Stop())
            self._loop.join()
        shards = self._view.shards
        coordinator = self._process(shards[0].primary_pid) if shards else None
        lost = None
        if coordinator is not None:
            code = coordinator.stop(coordinator_grace)
            if code == 0:
                self._records.read_final_checkpoint()
            failure = self._records.final_failure()
            if failure is not None:
                lost = str(failure)
            elif self.settings.checkpoints and code == -signal.SIGKILL:  # past its grace
                lost = (
                    f"ps shard 0 was {describe_code(code)} before it wrote a final "
                    "checkpoint: a restart resumes from the newest one, without the steps since"
                )
        pids = [s.primary_pid for s in shards[1:]] + [s.backup_pid for s in shards]
        stop_all([p for p in map(self._process, pids) if p is not None], STOP_GRACE)
        self._records.stop()
        return lost

    def _begin(self) -> None:
        self._records.start()
        self._loop = spawn("ps-supervisor", self._run)

    def _indices(self) -> range:
        return range(self._launch_with.num_shards)

    def _process(self, pid: int | None) -> WorkerProcess | None:
        return None if pid is None else self._processes.get(pid)

    # ---- the loop ----
    def _run(self) -> None:
        while True:
            message = self._inbox.get()
            self._handle(message)
            if isinstance(message, m.Stop):
                return

    def _handle(self, message: m.Message) -> None:
        """Decide on ``message`` and carry the actions out (in the loop's thread; the
        news an action brings back is handled at once, before the next message)."""
        self._view, actions = rules.decide(
            self._view, message, self._clock(), self.settings.restarts
        )
        for action in actions:
            self._act(action)
        if not self._view.not_ready():
            self._settled.set()

    def _act(self, action: rules.Action) -> None:
        self._doers[type(action)](action)

    def _emit(self, action: rules.Emit) -> None:
        self._events.emit(action.event)

    def _offer(self, action: rules.TryFailOver) -> None:
        self._handle(self._fail_over(action))

    def _give_up(self, action: rules.GiveUp) -> None:
        if self._stopping:
            return  # the job's end is under way: nothing is left to fail
        self._settled.set()
        self._on_fatal(action.reason)

    def _relaunch(self, action: rules.Launch) -> None:
        try:
            host = self._start_process(
                action.index, action.role, action.previous, action.primary_host, now=True
            )
        except LauncherError as exc:
            self._handle(m.Fatal(f"cannot restart ps shard {action.index}: {exc}"))
            return
        if host is not None and action.says_restart:
            steps = self._records.steps()
            self._events.emit(restart_event(action.index, self.settings.checkpoints, steps))

    # ---- processes ----
    def _start_process(
        self, index: int, role: Role, previous: str | None, primary_host: str, now: bool = False
    ) -> str | None:
        """Start shard ``index``'s ``role`` (``previous``: where its last one ran;
        ``primary_host``: the shard's, for a backup) and watch it; its host, None when
        stopping. Its news is handled at once when ``now`` (in the loop's thread), else
        posted.

        Raises:
            LauncherError: it cannot be started.
        """
        placement = self._placement
        if role is Role.PRIMARY:
            host = placement.host_for(index, previous)
            command = placement.command_for(index, host)
            label = f"ps{index}"
        else:
            host = placement.backup_host_for(index, primary_host, previous)
            command = (*placement.command_for(index, host), BACKUP_FLAG)
            label = f"ps{index}-backup"
        spec = LaunchSpec(
            host=host,
            slot=index,
            command=command,
            env=dict(self._launch_with.env),
            cwd=os.getcwd(),
            label=label,
        )
        with self._launching:
            if self._stopping:
                return None
            proc = self._launch_with.launcher.launch(spec)
            self._processes[proc.pid] = proc
            news = m.Launched(index, role, proc.pid, host)
            if not now:
                self._inbox.put(news)  # before ``stop`` can post ``Stop``
        if now:
            self._handle(news)
        self._watch(index, proc)
        return host

    def _take_over(self, index: int, role: Role, proc: WorkerProcess) -> None:
        """Supervise ``proc``, started by a predecessor, as shard ``index``'s ``role``."""
        with self._launching:
            self._processes[proc.pid] = proc
            self._inbox.put(m.Adopted(index, role, proc.pid, proc.spec.host))
        self._watch(index, proc)

    def _watch(self, index: int, proc: WorkerProcess) -> None:
        def wait() -> None:
            self._inbox.put(m.Exited(index, proc.pid, proc.wait(timeout=None)))

        spawn(f"{proc.spec.label}-wait", wait)

    # ---- failover ----
    def _fail_over(self, action: rules.TryFailOver) -> m.Message:
        """Offer the shard to its backup if the store says it is in step with the
        primary that died (read afresh, and written by compare-and-swap: see
        ``driver.ps.failover``): the answer for the rules, or ``Fatal`` when the store
        cannot tell whether the promotion was written."""
        index = action.index
        backup, dead = self._process(action.backup_pid), self._process(action.dead_pid)
        refused = m.FailOverAnswer(index, None)
        if backup is None or dead is None or backup.poll() is not None:
            return refused
        keys = self._keys
        try:
            replica = self._store.get(keys.ps_replica(index))
            dead_info = self._store.get(keys.ps_shard(index))
            backup_info = self._store.get(keys.ps_backup(index))
            if replica is None or dead_info is None or backup_info is None:
                return refused
            dead_address = _address_of(dead_info.value, dead.pid)
            backup_address = _address_of(backup_info.value, backup.pid)
            order = promotion(ReplicaRecord.from_json(replica.value), dead_address, backup_address)
            if order is None or dead_address is None or backup_address is None:
                return refused
        except (RendezvousError, ValueError, TypeError) as exc:
            log.warning("ps shard %d: no failover to its backup (%s); restarting it", index, exc)
            return refused
        return self._promote(
            index, order, replica.mod_revision, Handover(dead_address, backup_address)
        )

    def _promote(
        self, index: int, order: ReplicaRecord, revision: int, handover: Handover
    ) -> m.Message:
        """Write ``order`` if the record is still at ``revision``: the answer whether it
        was written. When the store's answer is lost, the record is read back to tell: a
        promotion that was written and then taken for lost would leave two primaries; a
        store that cannot tell is ``Fatal`` (neither restart the shard nor count on its
        backup: the job ends)."""
        key = self._keys.ps_replica(index)
        try:
            written = self._store.compare_and_swap(key, order.to_json(), revision)
            return m.FailOverAnswer(index, handover if written else None)
        except RendezvousError as exc:
            log.warning("ps shard %d: the promotion's answer was lost (%s)", index, exc)
        try:
            current = self._store.get(key)
        except RendezvousError as exc:
            return m.Fatal(f"cannot tell whether ps shard {index}'s backup took over: {exc}")
        written = current is not None and ReplicaRecord.from_json(current.value) == order
        return m.FailOverAnswer(index, handover if written else None)


def _address_of(value: bytes, pid: int) -> str | None:
    """The address in a ``ShardInfo`` when it is process ``pid``'s record."""
    info = ShardInfo.from_json(value)
    return info.address if info.pid == pid else None
