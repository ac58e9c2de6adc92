"""Coordinated checkpoints and rollbacks, driven by shard 0 (the driver never imports
``elastic``, so the protocol lives in the shards).

Checkpoint ``k`` (every ``checkpoint_interval`` seconds, one at a time):

1. *Prepare*: every shard closes its gate (no push is applied from then on; applies
   run under the state lock, so none is half done) and reports its step. The pause is
   a lease: a shard reopens by itself after ``pause_timeout`` if shard 0 dies.
2. *Align*: a client pushes to all shards in parallel, so at the pause a push may
   have been applied on some shards and not yet on others. The target is the highest
   step reported; shards below it let pushes through (only) until they reach it.
   The missing pushes are normally in flight and arrive within milliseconds. If one
   never comes (its worker died mid-push) within ``align_timeout``: async shards set
   their step to the target (async updates carry no cross-shard ordering anyway);
   sync shards abort the checkpoint (it is retried at the next interval; the round
   change that follows the worker's death resolves the step).
3. *Snapshot*: each shard copies its state in memory, reopens its gate at once, and
   then writes its file (atomic, checksummed), off the training path.
4. *Commit*: when every file is written, shard 0 writes the manifest, which makes
   checkpoint ``k`` complete, and prunes old ones. Any failure before that aborts:
   pauses are released and the attempt's directory is deleted (without a manifest it
   would never be loaded, and one per attempt would pile up while the cause lasts).
   Checkpoint ids only grow, even past a deleted attempt: a shard still writing a
   file of an attempt that failed never writes it into a later one.

Nothing is written when every shard still equals the newest checkpoint.

A full disk. Before the shards write, shard 0 makes room when the disk has less free
space than the next checkpoint will take (``checkpoint.make_room``: the oldest
checkpoints go first, never the newest complete one), so ``keep_checkpoints`` that do
not fit beside a new one are fewer rather than every checkpoint failing. An attempt
that finds the disk full all the same (``PSNoSpaceError``) leaves the newest complete
checkpoint alone for the next. A streak of failed attempts, and a stop's checkpoint
that cannot be written, are said in the log and to the driver (``failures.py``).

A checkpoint for a stop (``seal``: the job ends, or a shard got SIGTERM) is the same
with a seal on *Prepare*: after their snapshot the shards keep the gate closed (for
``pause_timeout``, a rollback, or until they exit), so no step can be applied after
the checkpoint and it holds the last step any client saw applied. When the shards
still equal the newest checkpoint, that one is sealed and kept.

Rollback (sync mode). A restarted shard must not serve a step the others have gone
past, so: shard 0 (at its own start, or when a restarted shard calls ``RestoreAll``)
takes the newest complete checkpoint C, asks every shard for its status, and rolls
back every shard that is not exactly at C, under a new *generation* when any shard had
moved past C. Clients see the generation change and redo from C instead of pushing
gradients of lost steps; the steps between C and the highest step a shard had reached
are lost, and ``on_rollback`` says so (the driver reports it). Rollbacks and
checkpoints are serialized on shard 0.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple

from ps.errors import PSCheckpointError, PSCheckpointWriteError, PSError, PSNoSpaceError
from ps.protocol import (
    ABORT,
    ALIGN,
    PREPARE,
    ROLLBACK,
    SNAPSHOT,
    STATUS,
    A,
    Call,
    CheckpointArgs,
    Empty,
    R,
    RollbackArgs,
    ShardStatus,
)
from ps.settings import ServerSettings
from ps.shard.checkpoint import (
    FileRecord,
    Manifest,
    checkpoint_ids,
    is_complete,
    load_newest,
    make_checkpoint_dir,
    make_room,
    next_checkpoint_id,
    prune,
    read_manifest,
    remove_checkpoint,
    write_manifest,
)
from ps.shard.control import Peers, ShardControl
from ps.shard.failures import CheckpointFailures
from ps.shard.state import initial_generation
from rendezvous.retry import Backoff
from rendezvous.schema.ps import CheckpointFailedRecord, RollbackRecord

log = logging.getLogger("ps.shard.coordinator")


class _Aborted(Exception):
    """Internal: checkpoint attempt ``checkpoint_id`` failed (every pause released, its
    directory deleted): of the shards' ``step`` (None: not known yet), and
    ``write_failed`` when a disk refused a file."""

    def __init__(self, message: str, checkpoint_id: int, step: int | None, write_failed: bool):
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.step = step
        self.write_failed = write_failed


class _Taken(NamedTuple):
    """A checkpoint that holds the shards' state: newly ``written``, or kept."""

    manifest: Manifest
    pause_ms: float
    write_ms: float
    written: bool


class Coordinator:
    """Runs on shard 0: checkpoints (``run``/``checkpoint_once``) and ``restore_all``.
    ``on_checkpoint(manifest, pause_ms, write_ms, final)``: a checkpoint is complete;
    ``on_rollback(record)``: the shards went back to an older step than they reached;
    ``on_failure(record)``: checkpoints fail (``failures.py`` says when)."""

    def __init__(
        self,
        settings: ServerSettings,
        local: ShardControl,
        peers: Peers | None,
        on_checkpoint: Callable[[Manifest, float, float, bool], None] | None = None,
        on_rollback: Callable[[RollbackRecord], None] | None = None,
        on_failure: Callable[[CheckpointFailedRecord], None] | None = None,
    ):
        self.settings = settings
        self.local = local
        self.peers = peers
        self.on_checkpoint = on_checkpoint
        self.on_rollback = on_rollback
        self.failures = CheckpointFailures(settings.checkpoint_dir or "", on_failure)
        self._lock = threading.Lock()  # one checkpoint or rollback at a time
        self._next_id = 1  # ids only grow (see the module doc)
        self._pool = ThreadPoolExecutor(max(settings.num_shards, 1), thread_name_prefix="ps-coord")

    def _invoke(self, index: int, call: Call[A, R], args: A, retry_for: float) -> R:
        if index == self.settings.index:
            return self.local.handle(call, args)
        if self.peers is None:
            raise PSError(f"shard {index} cannot be reached without the rendezvous store")
        return self.peers.call(index, call, args, retry_for)

    def _try_all(
        self,
        call: Call[A, R],
        args: A,
        retry_for: float = 0.0,
        indices: Iterable[int] | None = None,
    ) -> list[R | None]:
        """``call`` on every shard (of ``indices``) in parallel: their replies in index
        order, None for a shard that failed (logged)."""
        return self._gather(call, args, retry_for, indices, tolerate=True)

    def _all(self, call: Call[A, R], args: A) -> list[R]:
        """``call`` on every shard in parallel, one attempt each: their replies in index
        order. Raises the first error, once every call has finished."""
        return [r for r in self._gather(call, args, 0.0, None, tolerate=False) if r is not None]

    def _gather(
        self,
        call: Call[A, R],
        args: A,
        retry_for: float,
        indices: Iterable[int] | None,
        tolerate: bool,
    ) -> list[R | None]:
        indices = range(self.settings.num_shards) if indices is None else indices
        futures = {i: self._pool.submit(self._invoke, i, call, args, retry_for) for i in indices}
        results: list[R | None] = []
        first = None
        for i, f in futures.items():
            try:
                results.append(f.result())
            except Exception as exc:  # noqa: BLE001 - raised below, or tolerated and logged
                if not tolerate:
                    first = first or exc
                else:
                    log.warning("shard %d: %s failed: %s", i, call.name, exc)
                results.append(None)
        if first is not None:
            raise first
        return results

    # ------------------------------------------------------------ checkpoints
    def checkpoint_once(self) -> Manifest | None:
        """Take one coordinated checkpoint; returns its manifest, or None when skipped
        (nothing changed) or failed (said by ``failures``).

        Raises:
            PSConfigError: the shards have no checkpoint directory."""
        try:
            taken = self._checkpoint(seal=False)
        except _Aborted as exc:
            self._failed(exc, final=False)
            return None
        if taken is None:
            return None
        self._announce(taken, final=False)
        return taken.manifest

    def seal(self, deadline: float, final: bool) -> Manifest | None:
        """A checkpoint for a stop: a coordinated checkpoint after which every shard
        applies nothing more (``ShardState.prepare``'s seal), so it holds the last step
        any client saw applied. Attempts that abort (a push still in flight, a shard
        restoring) are repeated until ``deadline`` (monotonic). When the shards already
        equal a complete checkpoint, that one is kept and nothing is written; when this
        shard is still sealed by an earlier call, its checkpoint is returned at once.
        ``final``: the coordinator itself stops with the job, and the checkpoint is
        announced as the final one. A disk that refuses a file twice (the second time
        with the room the first failure made) ends the attempts before ``deadline``:
        it will not take the file within the seconds a stop has either. Returns the
        manifest holding the sealed state, or None (nothing to keep, or no checkpoint:
        said by ``failures``, as the final one with ``final``)."""
        root = self.settings.checkpoint_root()
        backoff = Backoff(deadline, initial=0.05, cap=1.0)
        refused = False  # a disk refused a file of an earlier attempt
        while True:
            try:
                taken = self._sealed_already(root) or self._checkpoint(seal=True)
            except _Aborted as exc:
                if not (refused and exc.write_failed) and backoff.pause():
                    refused = refused or exc.write_failed
                    continue
                self._failed(exc, final=final)
                return None
            if taken is None:
                return None
            if final or taken.written:
                self._announce(taken, final)
            return taken.manifest

    def _sealed_already(self, root: str) -> _Taken | None:
        sealed = self.local.state.sealed_at()
        if sealed is None:
            return None
        try:
            return _Taken(read_manifest(root, sealed), 0.0, 0.0, written=False)
        except PSCheckpointError as exc:
            log.warning("sealed at checkpoint %d, which does not read: %s", sealed, exc)
            return None

    def _checkpoint(self, seal: bool) -> _Taken | None:
        """One coordinated checkpoint (see the module doc): its manifest, how long
        training was paused and how long the files took (ms). When every shard still
        equals the newest complete checkpoint nothing is written: None, or with
        ``seal`` that checkpoint, kept (the pauses stay, as its seal).

        Raises:
            _Aborted: a shard or a disk failed (the pauses are released and the
                attempt's directory is deleted).
            PSConfigError: the shards have no checkpoint directory."""
        s = self.settings
        root = s.checkpoint_root()
        with self._lock:
            # Before the pause, which deleting files on a slow disk would stretch; none
            # is deleted unless the disk is short of room for the next checkpoint.
            deleted = make_room(root)
            if deleted:
                log.info(
                    "deleted checkpoint(s) %s early: the disk of %s has too little space "
                    "for another",
                    deleted,
                    root,
                )
            checkpoint_id = max(next_checkpoint_id(root), self._next_id)
            args = CheckpointArgs(checkpoint_id, seal=seal)
            started = time.monotonic()
            target: int | None = None
            try:
                statuses = self._all(PREPARE, args)
                # sync only: async shards restore alone, generations do not matter there
                if s.mode == "sync" and len({st.generation for st in statuses}) > 1:
                    raise PSError("shards are in different generations (a rollback is under way)")
                bases = {st.base for st in statuses}
                base = next(iter(bases))
                if (
                    all(st.clean for st in statuses)
                    and len(bases) == 1
                    and (base is None or is_complete(root, base))
                ):
                    kept = self._kept(root, base) if seal else None
                    if kept is not None:  # the pauses stay: they seal checkpoint ``base``
                        pause_ms = 1000 * (time.monotonic() - started)
                        return _Taken(kept, pause_ms, 0.0, written=False)
                    if not seal or base is None:
                        self._try_all(ABORT, args)
                        return None
                target = max(st.step for st in statuses)
                if any(st.step < target for st in statuses):
                    aligned = self._all(ALIGN, CheckpointArgs(checkpoint_id, target))
                    if any(a.step < target for a in aligned):
                        raise PSError(
                            f"shards did not reach step {target} within "
                            f"{s.align_timeout}s (steps {[a.step for a in aligned]})"
                        )
                paused = time.monotonic()
                self._next_id = checkpoint_id + 1  # its directory may exist from now on
                make_checkpoint_dir(root, checkpoint_id)
                records = self._all(SNAPSHOT, args)
                manifest = Manifest(
                    checkpoint_id,
                    target,
                    s.num_shards,
                    s.split_threshold,
                    tuple(FileRecord(r.name, r.size, r.sha256) for r in records),
                    time.time(),
                )
                write_manifest(root, manifest)
            except Exception as exc:  # noqa: BLE001 - any failure aborts this checkpoint
                log.debug("checkpoint %d aborted: %s", checkpoint_id, exc)
                self._try_all(ABORT, args)
                # without a manifest it is never loaded, and one a try would pile up
                remove_checkpoint(root, checkpoint_id)
                if isinstance(exc, PSNoSpaceError):
                    prune(root, 1)  # the most room for the next attempt
                write_failed = isinstance(exc, PSCheckpointWriteError)
                raise _Aborted(str(exc), checkpoint_id, target, write_failed) from None
            prune(root, s.keep_checkpoints)
        self.failures.written(checkpoint_id)
        pause_ms, write_ms = 1000 * (paused - started), 1000 * (time.monotonic() - paused)
        log.info(
            "checkpoint %d complete at step %d (pause %.0f ms, files %.0f ms)%s",
            checkpoint_id,
            target,
            pause_ms,
            write_ms,
            ", sealed for the stop" if seal else "",
        )
        return _Taken(manifest, pause_ms, write_ms, written=True)

    @staticmethod
    def _kept(root: str, base: int | None) -> Manifest | None:
        """The manifest of checkpoint ``base``, which every shard still equals; None when
        there is none (nothing was ever trained) or it no longer reads (then the state
        is written again)."""
        if base is None:
            return None
        try:
            return read_manifest(root, base)
        except PSCheckpointError as exc:
            log.warning("checkpoint %d no longer reads, writing the state again: %s", base, exc)
            return None

    def _failed(self, exc: _Aborted, final: bool) -> None:
        """Say (``failures``) that attempt ``exc`` failed."""
        self.failures.failed(exc.checkpoint_id, exc.step, str(exc), self._newest(), final)

    def _newest(self) -> tuple[int, int] | None:
        """The newest complete checkpoint's (id, step), None: none (or unreadable)."""
        root = self.settings.checkpoint_root()
        with self._lock:
            for checkpoint_id in reversed(checkpoint_ids(root)):
                if is_complete(root, checkpoint_id):
                    try:
                        return checkpoint_id, read_manifest(root, checkpoint_id).step
                    except PSCheckpointError:
                        continue
        return None

    def _announce(self, taken: _Taken, final: bool) -> None:
        if self.on_checkpoint is not None:
            self.on_checkpoint(taken.manifest, taken.pause_ms, taken.write_ms, final)

    def run(self, stop: threading.Event) -> None:
        """Checkpoint every ``checkpoint_interval`` seconds until ``stop`` is set."""
        while not stop.wait(self.settings.checkpoint_interval):
            try:
                self.checkpoint_once()
            except Exception:  # keep checkpointing: the next one may work
                log.exception("checkpoint failed")

    # ------------------------------------------------------------ rollback
    def restore_all(self) -> tuple[int | None, str]:
        """Bring every reachable shard to the newest complete checkpoint (see module
        doc); returns (checkpoint id or None, generation). Shards that stay
        unreachable for ``peer_deadline`` are skipped: they restore when they start."""
        s = self.settings
        with self._lock:
            loaded = load_newest(s.checkpoint_dir)
            checkpoint_id = loaded.checkpoint_id if loaded else None
            statuses = self._try_all(STATUS, Empty(), retry_for=s.peer_deadline)

            def at_checkpoint(st: ShardStatus) -> bool:
                return st.loaded and st.base == checkpoint_id and st.clean

            moved_on = any(
                st is not None and st.loaded and not at_checkpoint(st) for st in statuses
            )
            generation = initial_generation(checkpoint_id)
            if moved_on:
                generation += "-" + secrets.token_hex(4)
            todo = [
                i
                for i, st in enumerate(statuses)
                if st is not None and not (at_checkpoint(st) and st.generation == generation)
            ]
            if todo:
                log.info(
                    "restoring shards %s to %s (generation %s)",
                    todo,
                    f"checkpoint {checkpoint_id}" if checkpoint_id else "the empty start",
                    generation,
                )
                self._try_all(
                    ROLLBACK,
                    RollbackArgs(checkpoint_id, generation),
                    retry_for=s.peer_deadline,
                    indices=todo,
                )
            reached = max((st.step for st in statuses if st is not None and st.loaded), default=0)
            restored = loaded.step if loaded else 0
            if moved_on and reached > restored and self.on_rollback is not None:
                # the restarted shard (the one with nothing loaded) caused it
                fresh = [i for i, st in enumerate(statuses) if st is None or not st.loaded]
                cause = fresh[0] if fresh else s.index
                self.on_rollback(RollbackRecord(cause, reached, restored, checkpoint_id))
            return checkpoint_id, generation

    def close(self) -> None:
        self._pool.shutdown(wait=False)
