"""Parameter-server shards under the driver (``--num-ps N``): start, watch, restart.

Each shard is ``python -m elastic.ps.server --index I ...`` on the driver's machine (the
driver starts a command; it never imports ``elastic``). Shards tell the driver what it
needs through the store, the one route for these facts:

* shard ``I`` writes its ``rendezvous.plan.ShardInfo`` under ``JobKeys.ps_shard(I)``:
  ``ready=False`` while it restores a checkpoint, ``ready=True`` once it serves. A shard
  is ready for the supervisor when that record says ready *and* carries the pid of the
  process the supervisor launched, so the record of a shard that died is never taken
  for its replacement's (``ps_started``);
* the coordinating shard writes a ``rendezvous.plan.CheckpointRecord`` under
  ``JobKeys.ps_checkpoint`` after each complete checkpoint (``checkpoint_written``).

A shard that dies is restarted with the same arguments: it loads the newest complete
checkpoint, and clients retry until it is back. A shard dying over and over
(``MAX_RESTARTS`` within ``RESTART_WINDOW``) ends the job through ``on_fatal``:
restarting cannot fix whatever kills it.

Stopping (``stop``: the job's end, or SIGTERM/SIGINT to the driver) loses no applied
step: shard 0 is stopped first, with ``STOP_GRACE_COORDINATOR`` seconds before SIGKILL.
On SIGTERM it writes a final coordinated checkpoint that seals every shard (none
applies a push after it, so it holds the last step any worker saw applied), within
``FINAL_CHECKPOINT_TIMEOUT`` (its ``--stop-timeout``), and announces it with
``final`` set; the other shards, sealed, then stop at once. The supervisor reads that
record once more after shard 0 exits, so ``checkpoint_written`` with ``final`` is in
the event log before ``stop`` returns.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Callable

from driver.errors import JobFailed, LauncherError
from driver.events import CheckpointWritten, EventSink, PsExited, PsRestarted, PsStarted
from driver.launch.base import Launcher
from driver.launch.process import STOP_GRACE, WorkerProcess, stop_all
from driver.launch.spec import LaunchSpec
from driver.ps.shard_hosts import ShardPlacement
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.plan import CheckpointRecord, ShardInfo
from rendezvous.store import PUT, KeyValue, KVStore
from rendezvous.watch import follow_prefix

log = logging.getLogger(__name__)

MAX_RESTARTS = 10
RESTART_WINDOW = 60.0

FINAL_CHECKPOINT_TIMEOUT = 20.0
"""Seconds a stopping shard tries to checkpoint the shards' state (``--stop-timeout``)."""

STOP_GRACE_COORDINATOR = FINAL_CHECKPOINT_TIMEOUT + 5.0
"""SIGTERM to SIGKILL for shard 0 when the job stops: its final checkpoint's bound plus
time to exit. With ``STOP_GRACE`` for the workers after it, a stop takes at most about
30 s, what schedulers commonly allow between SIGTERM and SIGKILL."""

FINAL_RECORD_WAIT = 5.0
"""Bound on reading the final checkpoint's record once shard 0 has exited."""


def shard_command(
    index: int,
    num_shards: int,
    mode: str,
    bind_host: str,
    checkpoint_dir: str | None,
    checkpoint_interval: float,
) -> tuple[str, ...]:
    """The command line of shard ``index`` (pure)."""
    command = [
        sys.executable,
        "-m",
        "elastic.ps.server",
        "--index",
        str(index),
        "--num-shards",
        str(num_shards),
        "--mode",
        mode,
        "--bind",
        f"{bind_host}:0",
    ]
    if checkpoint_dir:
        command += [
            "--checkpoint-dir",
            checkpoint_dir,
            "--checkpoint-interval",
            str(checkpoint_interval),
            "--stop-timeout",
            f"{FINAL_CHECKPOINT_TIMEOUT:g}",
        ]
    return tuple(command)


class PSSupervisor:
    """Runs shard ``i`` as ``commands[i]`` with ``env`` added to the driver's environment,
    on the driver's machine; or, with a ``placement``, on the host and with the command
    line it says (``driver.ps.shard_hosts``: a shard whose host is lost moves).

    ``store``/``keys``: where the shards' records are; ``launcher`` starts them (as
    ``localhost`` slot ``i``, output prefixed ``[psI]``); ``events`` receives the ps
    events; ``on_fatal(reason)`` is called (from a supervisor thread) when the shards
    cannot go on. ``ready_timeout``: how long ``start`` waits; ``store_patience``: how
    long the store may be unreachable before that is fatal."""

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
    ):
        self.commands = list(commands)
        self._placement = placement or ShardPlacement(lambda index, host: self.commands[index])
        self._hosts: dict[int, str] = {}  # shard -> the host it was last started on
        self.env = dict(env)
        self.num_shards = len(self.commands)
        self.ready_timeout = ready_timeout
        self._store = store
        self._keys = keys
        self._launcher = launcher
        self._events = events
        self._on_fatal = on_fatal
        self._store_patience = store_patience
        self._clock = clock
        self._lock = threading.Condition()
        self._procs: dict[int, WorkerProcess] = {}
        self._records: dict[int, ShardInfo] = {}  # the newest record of each shard
        self._ready: dict[int, int] = {}  # shard -> pid announced ready
        self._last_checkpoint: tuple[int, bool] | None = None
        self._restarts: dict[int, deque[float]] = {i: deque() for i in range(self.num_shards)}
        self._fatal: str | None = None
        self._stopping = threading.Event()
        self._unfollow = threading.Event()  # set once the shards are gone
        self._threads: list[threading.Thread] = []

    # ---- lifecycle ----
    def start(self) -> None:
        """Follow the shards' records, start every shard, and wait until each is ready.

        Raises:
            JobFailed: a shard is not ready within ``ready_timeout``, or the shards
                cannot go on (the ``on_fatal`` reason).
            LauncherError: a shard cannot be started.
        """
        self._follow_records()
        for index in range(self.num_shards):
            self._launch(index)
        deadline = self._clock() + self.ready_timeout
        with self._lock:
            while len(self._ready) < self.num_shards:
                if self._fatal is not None:
                    raise JobFailed(self._fatal)
                remaining = deadline - self._clock()
                if remaining <= 0:
                    missing = sorted(set(range(self.num_shards)) - set(self._ready))
                    raise JobFailed(
                        f"ps shards {missing} not ready within "
                        f"{self.ready_timeout:g}s (see their output above)"
                    )
                self._lock.wait(min(remaining, 0.5))

    def adopt(self, running: Mapping[int, WorkerProcess]) -> None:
        """Supervise shards a driver that led the job before started (``running``, by
        index: the handles their agent's records gave) as if this one had: follow their
        records and checkpoints, restart them when they die; start the missing ones
        (without waiting for them: clients retry until they serve).

        Raises:
            LauncherError: a missing shard cannot be started.
        """
        self._follow_records()
        for index in range(self.num_shards):
            proc = running.get(index)
            if proc is None:
                self._launch(index)
                continue
            with self._lock:
                self._procs[index] = proc
                self._hosts[index] = proc.spec.host
                self._ready[index] = proc.pid  # it served its predecessor
            threading.Thread(
                target=self._watch, args=(index, proc), daemon=True, name=f"ps{index}-wait"
            ).start()

    def _follow_records(self) -> None:
        """Follow the shards' records and the checkpoints, each in a thread."""
        for name, prefix, take in (
            ("ps-shards", self._keys.ps, self._take_shard_record),
            ("ps-checkpoints", self._keys.ps_checkpoint, self._take_checkpoint),
        ):
            thread = threading.Thread(
                target=self._follow, args=(prefix, take), name=name, daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, coordinator_grace: float = STOP_GRACE_COORDINATOR) -> None:
        """Stop every shard: shard 0 first (SIGTERM: its final checkpoint, SIGKILL after
        ``coordinator_grace`` seconds), then the others (``STOP_GRACE``); report the
        final checkpoint (``checkpoint_written`` with ``final``) when shard 0 wrote one."""
        with self._lock:
            self._stopping.set()
            procs = dict(self._procs)
        coordinator = procs.pop(0, None)
        if coordinator is not None and coordinator.stop(coordinator_grace) == 0:
            self._read_final_checkpoint()
        stop_all(list(procs.values()), STOP_GRACE)
        self._unfollow.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def _read_final_checkpoint(self) -> None:
        """Take the checkpoint record as shard 0 left it (the watch may not have
        delivered it yet), reading the store from a thread so that an unreachable
        store delays the stop by ``FINAL_RECORD_WAIT`` at most."""
        found: list[KeyValue | None] = []

        def read() -> None:
            try:
                found.append(self._store.get(self._keys.ps_checkpoint))
            except RendezvousError as exc:
                log.warning("cannot read the final checkpoint's record: %s", exc)

        reader = threading.Thread(target=read, name="ps-final-checkpoint", daemon=True)
        reader.start()
        reader.join(timeout=FINAL_RECORD_WAIT)
        if found and found[0] is not None:
            self._take_checkpoint(found[0])

    # ---- the store ----
    def _follow(self, prefix: str, take: Callable[[KeyValue], None]) -> None:
        def on_event(event) -> None:
            if event.type == PUT:
                take(event.kv)

        def on_resync(kvs: Sequence[KeyValue]) -> None:
            for kv in kvs:
                take(kv)

        follow_prefix(
            self._store,
            prefix,
            None,
            on_event=on_event,
            on_resync=on_resync,
            on_lost=lambda exc: self._fail(
                f"lost the rendezvous store while watching the ps shards: {exc}"
            ),
            stop=self._unfollow,
            patience=self._store_patience,
            clock=self._clock,
        )

    def _take_shard_record(self, kv: KeyValue) -> None:
        try:
            info = ShardInfo.from_json(kv.value)
        except (ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable ps shard record under %s: %s", kv.key, exc)
            return
        with self._lock:
            self._records[info.index] = info
            ready = self._newly_ready(info.index)
        if ready is not None:
            self._events.emit(PsStarted(shard=ready.index, address=ready.address, pid=ready.pid))

    def _newly_ready(self, index: int) -> ShardInfo | None:
        """The record that makes shard ``index`` ready now, or None (call under the lock)."""
        proc, info = self._procs.get(index), self._records.get(index)
        if (
            proc is None
            or info is None
            or not info.ready
            or info.pid != proc.pid
            or self._ready.get(index) == proc.pid
        ):
            return None
        self._ready[index] = proc.pid
        self._lock.notify_all()
        return info

    def _take_checkpoint(self, kv: KeyValue) -> None:
        if kv.key != self._keys.ps_checkpoint:
            return
        try:
            record = CheckpointRecord.from_json(kv.value)
        except (ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable checkpoint record: %s", exc)
            return
        taken = (record.checkpoint_id, record.final)
        with self._lock:
            # The same checkpoint read again (after a watch ended, or by stop), or an
            # older one the watch delivers after stop read the final one: not news.
            if self._last_checkpoint is not None and taken <= self._last_checkpoint:
                return
            self._last_checkpoint = taken
        self._events.emit(
            CheckpointWritten(
                step=record.step,
                path=record.dir,
                checkpoint=record.checkpoint_id,
                seconds=round((record.pause_ms + record.write_ms) / 1e3, 3),
                final=record.final,
            )
        )

    # ---- one shard ----
    def _launch(self, index: int) -> bool:
        """Start shard ``index`` (False when stopping).

        Raises:
            LauncherError: the shard cannot be started.
        """
        host = self._placement.host_for(index, self._hosts.get(index))
        spec = LaunchSpec(
            host=host,
            slot=index,
            command=self._placement.command_for(index, host),
            env=self.env,
            cwd=os.getcwd(),
            label=f"ps{index}",
        )
        # Under the lock with the stopping check, so a restart racing ``stop`` cannot leave
        # a shard behind: either stop sees it, or it is never started.
        with self._lock:
            if self._stopping.is_set():
                return False
            proc = self._launcher.launch(spec)
            self._procs[index] = proc
            self._hosts[index] = host
            self._ready.pop(index, None)
            # Only a record written after this launch can make the new process ready.
            self._records.pop(index, None)
        thread = threading.Thread(
            target=self._watch, args=(index, proc), daemon=True, name=f"ps{index}-wait"
        )
        thread.start()
        return True

    def _watch(self, index: int, proc: WorkerProcess) -> None:
        code = proc.wait(timeout=None)
        if self._stopping.is_set():
            return
        self._events.emit(PsExited(shard=index, code=code))
        now = self._clock()
        history = self._restarts[index]
        history.append(now)
        while history and history[0] < now - RESTART_WINDOW:
            history.popleft()
        if len(history) > MAX_RESTARTS:
            self._fail(
                f"ps shard {index} died {len(history)} times within "
                f"{RESTART_WINDOW:g}s (last exit: {code}); giving up"
            )
            return
        try:
            if self._launch(index):
                self._events.emit(PsRestarted(shard=index))
        except LauncherError as exc:
            self._fail(f"cannot restart ps shard {index}: {exc}")

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            self._fatal = self._fatal or reason
            self._lock.notify_all()
        self._on_fatal(reason)
