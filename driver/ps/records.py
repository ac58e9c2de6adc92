"""What the ps shards say in the store, followed for the driver: one watch of every ps
key of the job (``JobKeys.ps_records``), so the records arrive in the order the store
took them, through outages (``rendezvous.watch.follow_prefix``).

* a shard's ``ShardInfo`` (``ps_shard(i)``), a backup's (``ps_backup(i)``) and a
  shard's ``ReplicaRecord`` (``ps_replica(i)``) are posted to the supervisor's queue
  (``driver.ps.messages``), whose rules know which process is which;
* each complete checkpoint (``ps_checkpoint``), each report of checkpoints that fail
  (``ps_checkpoint_failed``) and each rollback (``ps_rollback``) is reported here, once,
  as ``checkpoint_written``, ``checkpoint_failed`` and ``ps_rolled_back``;
* the steps they name are kept (``steps``: the newest complete checkpoint, the newest
  step named), for what a shard restarted by the driver is said to lose
  (``driver.policy.ps_restarts``).

Whether the shards stopped with their state in a checkpoint is the newer of the two
final records, in the store's order: a final ``CheckpointRecord`` (written) or a final
``CheckpointFailedRecord`` (not written: ``final_failure``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Callable

from driver.events import CheckpointFailed, CheckpointWritten, EventSink, PsRolledBack
from driver.policy.ps_restarts import ShardSteps
from driver.ps import messages as m
from driver.threads import spawn
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.schema.ps import (
    CheckpointFailedRecord,
    CheckpointRecord,
    ReplicaRecord,
    RollbackRecord,
    ShardInfo,
)
from rendezvous.store import PUT, Event, KeyValue, KVStore
from rendezvous.watch import follow_prefix

log = logging.getLogger(__name__)

FINAL_RECORD_WAIT = 5.0
"""Bound on reading the final checkpoint's records once shard 0 has exited."""


class ShardRecords:
    """Follows the ps records of the job under ``keys`` in ``store`` (``start``/``stop``)
    and reports checkpoints and rollbacks to ``events``; ``post`` takes the records the
    supervisor decides on, and ``Fatal`` when the store stayed unreachable for
    ``patience`` seconds (called in the follower's thread)."""

    def __init__(
        self,
        store: KVStore,
        keys: JobKeys,
        events: EventSink,
        *,
        post: Callable[[m.Message], None],
        patience: float,
        clock: Callable[[], float],
    ):
        self._store = store
        self._keys = keys
        self._events = events
        self._post = post
        self._patience = patience
        self._clock = clock
        self._lock = threading.Lock()
        self._last_checkpoint: tuple[int, bool] | None = None
        self._last_rollback = 0  # the mod revision of the newest rollback reported
        self._last_failure = 0  # ... and of the newest checkpoint failure reported
        # the newest final record (mod revision; the failure, None: written)
        self._final: tuple[int, CheckpointFailed | None] | None = None
        self._steps = ShardSteps()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = spawn("ps-records", self._follow)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _follow(self) -> None:
        def on_event(event: Event) -> None:
            if event.type == PUT:
                self.take(event.kv)

        def on_resync(kvs: Sequence[KeyValue]) -> None:
            for kv in kvs:
                self.take(kv)

        follow_prefix(
            self._store,
            self._keys.ps_records,
            None,
            on_event=on_event,
            on_resync=on_resync,
            on_lost=lambda exc: self._post(
                m.Fatal(f"lost the rendezvous store while watching the ps shards: {exc}")
            ),
            stop=self._stop,
            patience=self._patience,
            clock=self._clock,
        )

    def take(self, kv: KeyValue) -> None:
        """One record as the store holds it; an unreadable one is logged and ignored."""
        keys, key = self._keys, kv.key
        try:
            if key.startswith(keys.ps):
                self._post(m.PrimaryRecord(ShardInfo.from_json(kv.value)))
            elif key.startswith(keys.ps_backups):
                self._post(m.BackupRecord(ShardInfo.from_json(kv.value)))
            elif key.startswith(keys.ps_replicas):
                replica = ReplicaRecord.from_json(kv.value)
                self._note_step(replica.step)
                self._post(m.ReplicaSeen(replica))
            elif key == keys.ps_checkpoint:
                self._take_checkpoint(CheckpointRecord.from_json(kv.value), kv.mod_revision)
            elif key == keys.ps_checkpoint_failed:
                self._take_failure(CheckpointFailedRecord.from_json(kv.value), kv.mod_revision)
            elif key == keys.ps_rollback:
                self._take_rollback(RollbackRecord.from_json(kv.value), kv.mod_revision)
        except (ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable ps record under %s: %s", key, exc)

    def _note_final(self, revision: int, failure: CheckpointFailed | None) -> None:
        """A final record at ``revision`` (call under the lock)."""
        if self._final is None or revision > self._final[0]:
            self._final = (revision, failure)

    def steps(self) -> ShardSteps:
        """The shards' steps as their records told them so far."""
        with self._lock:
            return self._steps

    def _note_step(self, step: int | None) -> None:
        with self._lock:
            self._steps = self._steps.with_step(step)

    def _take_checkpoint(self, record: CheckpointRecord, revision: int) -> None:
        taken = (record.checkpoint_id, record.final)
        with self._lock:
            self._steps = self._steps.with_checkpoint(record.checkpoint_id, record.step)
            if record.final:
                self._note_final(revision, None)
            # The same checkpoint read again (after a watch ended, or by the final read),
            # or an older one the watch delivers after the final read: not news.
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

    def _take_failure(self, record: CheckpointFailedRecord, revision: int) -> None:
        event = CheckpointFailed(
            checkpoint=record.checkpoint_id,
            step=record.step,
            path=record.dir,
            error=record.error,
            attempts=record.attempts,
            final=record.final,
            newest=record.newest,
            newest_step=record.newest_step,
        )
        with self._lock:
            self._steps = self._steps.with_step(record.step)
            if record.final:
                self._note_final(revision, event)
            if revision <= self._last_failure:
                return  # read again after a watch ended, or by the final read
            self._last_failure = revision
        self._events.emit(event)

    def final_failure(self) -> CheckpointFailed | None:
        """The report that the shards' final checkpoint could not be written, when the
        newest final record says so (None: it was written, or none was read)."""
        with self._lock:
            return self._final[1] if self._final is not None else None

    def _take_rollback(self, record: RollbackRecord, revision: int) -> None:
        with self._lock:
            self._steps = self._steps.with_step(record.from_step)
            if revision <= self._last_rollback:
                return  # read again after a watch ended
            self._last_rollback = revision
        self._events.emit(
            PsRolledBack(
                shard=record.shard,
                from_step=record.from_step,
                to_step=record.to_step,
                lost_steps=record.from_step - record.to_step,
                checkpoint=record.checkpoint,
            )
        )

    def read_final_checkpoint(self) -> None:
        """Take the checkpoint records (written, failed) as shard 0 left them (the
        watch may not have delivered them yet), reading the store from a thread so
        that an unreachable store delays the stop by ``FINAL_RECORD_WAIT`` at most."""
        found: list[KeyValue | None] = []

        def read() -> None:
            try:
                for key in (self._keys.ps_checkpoint, self._keys.ps_checkpoint_failed):
                    found.append(self._store.get(key))
            except RendezvousError as exc:
                log.warning("cannot read the final checkpoint's records: %s", exc)

        reader = threading.Thread(target=read, name="ps-final-checkpoint", daemon=True)
        reader.start()
        reader.join(timeout=FINAL_RECORD_WAIT)
        for kv in list(found):
            if kv is not None:
                self.take(kv)
