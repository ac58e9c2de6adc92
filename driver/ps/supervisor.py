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
empty (``ps_restarted``, ``driver.ps.restarts``). A shard dying over and over
(``MAX_RESTARTS`` within ``RESTART_WINDOW``, its backups' deaths counted too) ends the
job through ``on_fatal``: restarting cannot fix whatever kills it.

With ``--ps-replicas 1`` each shard also has a backup process (the same command line
with ``--backup``; on another host than the shard when the placement has one), which
copies the shard's state and holds every update before the shard acknowledges it. The
shard's ``ReplicaRecord`` says when a backup is in step (``ps_backup_ready``). When the
shard's process dies and its record names its backup in step, the supervisor gives the
shard to the backup (``driver.ps.failover``: a compare-and-swap of the record), which
serves it at once with every acknowledged step (``ps_failed_over``), and starts a new
backup for it; without a backup in step the shard restarts from the checkpoint as
above. A backup that dies is replaced (``ps_backup_exited``).

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
import signal
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Callable

from driver.errors import JobFailed, LauncherError
from driver.events import (
    EventSink,
    PsBackupExited,
    PsBackupReady,
    PsExited,
    PsFailedOver,
    PsStarted,
    describe_code,
)
from driver.events.base import Event
from driver.launch.base import Launcher
from driver.launch.process import STOP_GRACE, WorkerProcess, stop_all
from driver.launch.spec import LaunchSpec
from driver.ps.command import BACKUP_FLAG, FINAL_CHECKPOINT_TIMEOUT
from driver.ps.failover import promotion
from driver.ps.records import ShardRecords
from driver.ps.restarts import restart_event
from driver.ps.shard_hosts import ShardPlacement
from driver.threads import spawn
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.schema.ps import ReplicaRecord, ShardInfo
from rendezvous.store import KVStore

log = logging.getLogger(__name__)

MAX_RESTARTS = 10
RESTART_WINDOW = 60.0

STOP_GRACE_COORDINATOR = FINAL_CHECKPOINT_TIMEOUT + 5.0
"""SIGTERM to SIGKILL for shard 0 when the job stops: its final checkpoint's bound plus
time to exit. With ``STOP_GRACE`` for the workers after it, a stop takes at most about
30 s, what schedulers commonly allow between SIGTERM and SIGKILL."""


class _Shard:
    """What the supervisor knows of one shard: its processes (the primary that serves
    it, and with replicas its backup), where they run, and their newest records."""

    def __init__(self, index: int):
        self.index = index
        self.primary: WorkerProcess | None = None
        self.host: str | None = None
        self.backup: WorkerProcess | None = None
        self.backup_host: str | None = None
        self.backup_address: str | None = None  # from the backup process's own record
        self.replica: ReplicaRecord | None = None
        self.ready_pid: int | None = None  # the primary process that said it serves
        self.in_step_pid: int | None = None  # the backup process the replica record names
        self.failing_over: tuple[str, str] | None = None  # (from, to) until the backup serves
        self.deaths: deque[float] = deque()  # of its processes, within RESTART_WINDOW

    def ready(self, replicas: int) -> bool:
        primary_ready = self.primary is not None and self.ready_pid == self.primary.pid
        backup_ready = self.backup is not None and self.in_step_pid == self.backup.pid
        return primary_ready and (not replicas or backup_ready)


class PSSupervisor:
    """Runs shard ``i`` as ``commands[i]`` with ``env`` added to the driver's environment,
    on the driver's machine; or, with a ``placement``, on the host and with the command
    line it says (``driver.ps.shard_hosts``: a shard whose host is lost moves).
    ``replicas`` 1: each shard has a backup (see the module doc).

    ``store``/``keys``: where the shards' records are; ``launcher`` starts them (as
    ``localhost`` slot ``i``, output prefixed ``[psI]``, a backup's ``[psI-backup]``);
    ``events`` receives the ps events; ``on_fatal(reason)`` is called (from a supervisor
    thread) when the shards cannot go on. ``ready_timeout``: how long ``start`` waits;
    ``store_patience``: how long the store may be unreachable before that is fatal.
    ``checkpoints``: the shards checkpoint (``--ps-checkpoint-dir``)."""

    def __init__(
        self,
        commands: Sequence[tuple[str, ...]],
        env: Mapping[str, str],
        *,
        store: KVStore,
        keys: JobKeys,
        launcher: Launcher,
        events: EventSink,
        on_fatal: Callable[[str], None],
        ready_timeout: float,
        store_patience: float,
        clock: Callable[[], float] = time.monotonic,
        placement: ShardPlacement | None = None,
        replicas: int = 0,
        checkpoints: bool = False,
    ):
        self.commands = list(commands)
        self._placement = placement or ShardPlacement(lambda index, host: self.commands[index])
        self.env = dict(env)
        self.num_shards = len(self.commands)
        self.replicas = replicas
        self.checkpoints = checkpoints
        self.ready_timeout = ready_timeout
        self._store = store
        self._keys = keys
        self._launcher = launcher
        self._events = events
        self._on_fatal = on_fatal
        self._clock = clock
        self._lock = threading.Condition()
        self._shards = {i: _Shard(i) for i in range(self.num_shards)}
        self._fatal: str | None = None
        self._stopping = threading.Event()
        self._stopped: list[str | None] = []  # ``stop``'s answer, once it returned
        self._records = ShardRecords(
            store,
            keys,
            events,
            on_shard=self._take_shard,
            on_backup=self._take_backup,
            on_replica=self._take_replica,
            on_lost=self._fail,
            patience=store_patience,
            clock=clock,
        )

    @property
    def _procs(self) -> dict[int, WorkerProcess]:
        """The process serving each shard (its primary)."""
        with self._lock:
            return {i: s.primary for i, s in self._shards.items() if s.primary is not None}

    # ---- lifecycle ----
    def start(self) -> None:
        """Follow the shards' records, start every shard (and backup), and wait until
        each serves (and each backup is in step).

        Raises:
            JobFailed: a shard is not ready within ``ready_timeout``, or the shards
                cannot go on (the ``on_fatal`` reason).
            LauncherError: a shard cannot be started.
        """
        self._records.start()
        for index in range(self.num_shards):
            self._launch(index)
        for index in range(self.num_shards) if self.replicas else ():
            self._launch_backup(index)
        deadline = self._clock() + self.ready_timeout
        with self._lock:
            while not all(s.ready(self.replicas) for s in self._shards.values()):
                if self._fatal is not None:
                    raise JobFailed(self._fatal)
                remaining = deadline - self._clock()
                if remaining <= 0:
                    missing = [i for i, s in self._shards.items() if not s.ready(self.replicas)]
                    what = "ps shards (and their backups)" if self.replicas else "ps shards"
                    raise JobFailed(
                        f"{what} {missing} not ready within "
                        f"{self.ready_timeout:g}s (see their output above)"
                    )
                self._lock.wait(min(remaining, 0.5))

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
        self._records.start()
        for index in range(self.num_shards):
            proc = running.get(index)
            if proc is None:
                self._launch(index)
            else:
                with self._lock:
                    shard = self._shards[index]
                    shard.primary, shard.host = proc, proc.spec.host
                    shard.ready_pid = proc.pid  # it served its predecessor
                self._watch(index, proc)
            backup = (backups or {}).get(index)
            if backup is not None:
                with self._lock:
                    shard = self._shards[index]
                    shard.backup, shard.backup_host = backup, backup.spec.host
                self._watch(index, backup)
            elif self.replicas:
                self._launch_backup(index)

    def stop(self, coordinator_grace: float = STOP_GRACE_COORDINATOR) -> str | None:
        """Stop every shard: shard 0 first (SIGTERM: its final checkpoint, SIGKILL after
        ``coordinator_grace`` seconds), then the others and the backups
        (``STOP_GRACE``); report the final checkpoint (``checkpoint_written`` or
        ``checkpoint_failed`` with ``final``). Returns why the shards' last state is
        in no checkpoint (shard 0 said it could not write it, or was killed before it
        said anything), None when it is or there is nothing to say. A second call
        returns the first one's answer."""
        with self._lock:
            if self._stopped:
                return self._stopped[0]
            self._stopping.set()
            shards = list(self._shards.values())
        coordinator = shards[0].primary if shards else None
        lost = None
        if coordinator is not None:
            code = coordinator.stop(coordinator_grace)
            if code == 0:
                self._records.read_final_checkpoint()
            failure = self._records.final_failure()
            if failure is not None:
                lost = str(failure)
            elif self.checkpoints and code == -signal.SIGKILL:  # past its grace
                lost = (
                    f"ps shard 0 was {describe_code(code)} before it wrote a final "
                    "checkpoint: a restart resumes from the newest one, without the steps since"
                )
        rest = [s.primary for s in shards[1:]] + [s.backup for s in shards]
        stop_all([p for p in rest if p is not None], STOP_GRACE)
        self._records.stop()
        with self._lock:
            self._stopped.append(lost)
        return lost

    # ---- the records ----
    def _take_shard(self, info: ShardInfo) -> None:
        with self._lock:
            shard = self._shards.get(info.index)
            proc = shard.primary if shard is not None else None
            if shard is None or proc is None or not info.ready or info.pid != proc.pid:
                return
            if shard.ready_pid == proc.pid:
                return
            shard.ready_pid = proc.pid
            self._lock.notify_all()
        self._events.emit(PsStarted(shard=info.index, address=info.address, pid=info.pid))

    def _take_backup(self, info: ShardInfo) -> None:
        with self._lock:
            shard = self._shards.get(info.index)
            if shard is None or shard.backup is None or info.pid != shard.backup.pid:
                return
            shard.backup_address = info.address
            event = self._newly_in_step(shard)
        if event is not None:
            self._events.emit(event)

    def _take_replica(self, record: ReplicaRecord, revision: int) -> None:
        found: list[Event] = []
        event: Event | None
        with self._lock:
            shard = self._shards.get(record.index)
            if shard is None:
                return
            shard.replica = record
            moved = shard.failing_over
            if moved is not None and record.serving and record.primary == moved[1]:
                shard.failing_over = None
                found.append(PsFailedOver(record.index, moved[0], moved[1], record.step))
            event = self._newly_in_step(shard)
            if event is not None:
                found.append(event)
        for event in found:
            self._events.emit(event)

    def _newly_in_step(self, shard: _Shard) -> PsBackupReady | None:
        """The event when the replica record now names the shard's backup in step
        (call under the lock)."""
        backup, record = shard.backup, shard.replica
        if (
            backup is None
            or record is None
            or shard.backup_address is None
            or record.backup != shard.backup_address
            or shard.in_step_pid == backup.pid
        ):
            return None
        shard.in_step_pid = backup.pid
        self._lock.notify_all()
        return PsBackupReady(shard.index, shard.backup_address, backup.pid, record.step)

    # ---- processes ----
    def _launch(self, index: int) -> bool:
        """Start shard ``index``'s primary (False when stopping).

        Raises:
            LauncherError: the shard cannot be started.
        """
        with self._lock:
            previous = self._shards[index].host
        host = self._placement.host_for(index, previous)
        command = self._placement.command_for(index, host)
        proc = self._start(index, host, command, f"ps{index}")
        if proc is None:
            return False
        with self._lock:
            shard = self._shards[index]
            shard.primary, shard.host, shard.ready_pid = proc, host, None
            shard.failing_over = None  # a backup promoted and dead before it served
        self._watch(index, proc)
        return True

    def _launch_backup(self, index: int) -> bool:
        """Start a backup for shard ``index`` (False when stopping).

        Raises:
            LauncherError: it cannot be started.
        """
        with self._lock:
            shard = self._shards[index]
            primary_host, previous = shard.host or "", shard.backup_host
        host = self._placement.backup_host_for(index, primary_host, previous)
        command = (*self._placement.command_for(index, host), BACKUP_FLAG)
        proc = self._start(index, host, command, f"ps{index}-backup")
        if proc is None:
            return False
        with self._lock:
            shard = self._shards[index]
            shard.backup, shard.backup_host = proc, host
            shard.backup_address, shard.in_step_pid = None, None
        self._watch(index, proc)
        return True

    def _start(
        self, index: int, host: str, command: tuple[str, ...], label: str
    ) -> WorkerProcess | None:
        spec = LaunchSpec(
            host=host, slot=index, command=command, env=self.env, cwd=os.getcwd(), label=label
        )
        # Under the lock with the stopping check, so a restart racing ``stop`` cannot leave
        # a process behind: either stop sees it, or it is never started.
        with self._lock:
            if self._stopping.is_set():
                return None
            return self._launcher.launch(spec)

    def _watch(self, index: int, proc: WorkerProcess) -> None:
        def wait() -> None:
            self._exited(index, proc, proc.wait(timeout=None))

        spawn(f"{proc.spec.label}-wait", wait)

    def _exited(self, index: int, proc: WorkerProcess, code: int | None) -> None:
        if self._stopping.is_set():
            return
        with self._lock:
            shard = self._shards[index]
            primary, backup = proc is shard.primary, proc is shard.backup
            if backup:
                shard.backup, shard.backup_address, shard.in_step_pid = None, None, None
        if not (primary or backup):
            return  # a process the shard no longer counts on
        self._events.emit((PsExited if primary else PsBackupExited)(shard=index, code=code))
        if self._too_many(shard, code):
            return
        try:
            if backup:
                self._launch_backup(index)
            elif not self._fail_over(index, proc) and self._launch(index):
                steps = self._records.steps()
                self._events.emit(restart_event(index, self.checkpoints, steps))
        except LauncherError as exc:
            self._fail(f"cannot restart ps shard {index}: {exc}")

    def _too_many(self, shard: _Shard, code: int | None) -> bool:
        """Count a death of the shard's processes; True (and fatal) past the limit."""
        now = self._clock()
        with self._lock:
            history = shard.deaths
            history.append(now)
            while history and history[0] < now - RESTART_WINDOW:
                history.popleft()
            deaths = len(history)
        if deaths > MAX_RESTARTS:
            self._fail(
                f"ps shard {shard.index} died {deaths} times within "
                f"{RESTART_WINDOW:g}s (last exit: {code}); giving up"
            )
            return True
        return False

    def _fail_over(self, index: int, dead: WorkerProcess) -> bool:
        """Give shard ``index`` to its backup if the store says it is in step with the
        primary that died (read afresh, and written by compare-and-swap: see
        ``driver.ps.failover``), and start a new backup. False: restart it instead.

        Raises:
            LauncherError: the new backup cannot be started.
        """
        with self._lock:
            backup = self._shards[index].backup
        if not self.replicas or backup is None or backup.poll() is not None:
            return False
        keys = self._keys
        try:
            replica = self._store.get(keys.ps_replica(index))
            dead_info = self._store.get(keys.ps_shard(index))
            backup_info = self._store.get(keys.ps_backup(index))
            if replica is None or dead_info is None or backup_info is None:
                return False
            dead_address = _address_of(dead_info.value, dead.pid)
            backup_address = _address_of(backup_info.value, backup.pid)
            order = promotion(ReplicaRecord.from_json(replica.value), dead_address, backup_address)
            if order is None or dead_address is None or backup_address is None:
                return False
        except (RendezvousError, ValueError, TypeError) as exc:
            log.warning("ps shard %d: no failover to its backup (%s); restarting it", index, exc)
            return False
        if not self._promote(index, order, replica.mod_revision):
            return False
        with self._lock:
            shard = self._shards[index]
            shard.primary, shard.host, shard.ready_pid = backup, shard.backup_host, None
            shard.backup, shard.backup_host, shard.backup_address = None, None, None
            shard.in_step_pid = None
            shard.failing_over = (dead_address, backup_address)
        self._launch_backup(index)
        return True

    def _promote(self, index: int, order: ReplicaRecord, revision: int) -> bool:
        """Write ``order`` if the record is still at ``revision``; whether it was written.
        When the store's answer is lost, the record is read back to tell: a promotion
        that was written and then taken for lost would leave two primaries.

        Raises:
            LauncherError: never; see ``_fail`` for a store that cannot tell."""
        key = self._keys.ps_replica(index)
        try:
            return self._store.compare_and_swap(key, order.to_json(), revision)
        except RendezvousError as exc:
            log.warning("ps shard %d: the promotion's answer was lost (%s)", index, exc)
        try:
            current = self._store.get(key)
        except RendezvousError as exc:
            self._fail(f"cannot tell whether ps shard {index}'s backup took over: {exc}")
            return True  # neither restart it nor count on it: the job ends
        return current is not None and ReplicaRecord.from_json(current.value) == order

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            self._fatal = self._fatal or reason
            self._lock.notify_all()
        self._on_fatal(reason)


def _address_of(value: bytes, pid: int) -> str | None:
    """The address in a ``ShardInfo`` when it is process ``pid``'s record."""
    info = ShardInfo.from_json(value)
    return info.address if info.pid == pid else None
