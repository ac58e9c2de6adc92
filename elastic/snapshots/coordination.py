"""How the writers of one snapshot agree on its commit and learn that every part is
durable: through the job's store (``StoreCoordination``), or alone in a world of one
(``LocalCoordination``).

Under ``elastic-run`` rank 0 asks for a snapshot by writing ``SnapshotAt`` (the round,
the commit, a token) to ``JobKeys.snapshot_at``; every member follows that key and
snapshots that commit when it makes it. Each writer says its part is durable (or why it
is not) under ``JobKeys.snapshot_part`` (keyed by the attempt's token, so two attempts
at one commit never mix their parts; under no lease, so a part written by a member
that exits at once, as after a stop's snapshot, stays for the part 0 writer, who
deletes them); the writer of part 0 waits for all of them (or until its round is
superseded: a member that died writes none), then completes the snapshot and says so
under ``JobKeys.snapshots`` (``done``), or that it could not (``failed``). What a round
resumed from is said there too (``loaded``). The driver follows that prefix.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Callable, Sequence

from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.schema.snapshots import SnapshotAt, SnapshotPart, SnapshotRecord
from rendezvous.store import PUT, Event, KeyValue, KVStore
from rendezvous.watch import follow_in_thread

log = logging.getLogger(__name__)


class Coordination(abc.ABC):
    """What a process's snapshots ask of the other writers (see the module docstring)."""

    #: True in a world of one: a snapshot is of the commit at hand, no one to wait for
    alone: bool = False

    @abc.abstractmethod
    def target(self) -> SnapshotAt | None:
        """The newest snapshot asked for (None before any)."""

    @abc.abstractmethod
    def ask(self, at: SnapshotAt) -> None:
        """Ask every member for a snapshot (rank 0; returns at once)."""

    @abc.abstractmethod
    def part_written(self, group: str, at: SnapshotAt, part: SnapshotPart) -> None:
        """Say part ``part.part`` of ``group``'s snapshot ``at`` is durable, or why not
        (best effort, never raises)."""

    @abc.abstractmethod
    def wait_parts(
        self,
        group: str,
        at: SnapshotAt,
        parts: int,
        deadline: float,
        superseded: Callable[[], bool],
    ) -> list[SnapshotPart] | str:
        """Every part of ``group``'s snapshot ``at``, by part number, once all are
        durable; else why the snapshot is abandoned (a part failed, ``deadline`` passed,
        or ``superseded()``: a newer round came, so a missing part may never come)."""

    @abc.abstractmethod
    def say(self, key: str, record: SnapshotRecord) -> None:
        """Tell the driver ``record`` under ``key`` (best effort, never raises)."""

    @abc.abstractmethod
    def forget_parts(self, group: str, at: SnapshotAt) -> None:
        """The parts' records of a completed or abandoned snapshot are no longer needed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop following (idempotent)."""


class LocalCoordination(Coordination):
    """A world of one: nothing to agree on; what it would say goes to the log."""

    alone = True

    def __init__(self) -> None:
        self._target: SnapshotAt | None = None
        self._parts: dict[tuple[str, int, str], dict[int, SnapshotPart]] = {}

    def target(self) -> SnapshotAt | None:
        return self._target

    def ask(self, at: SnapshotAt) -> None:
        self._target = at

    def part_written(self, group: str, at: SnapshotAt, part: SnapshotPart) -> None:
        self._parts.setdefault((group, at.step, at.token), {})[part.part] = part

    def wait_parts(
        self,
        group: str,
        at: SnapshotAt,
        parts: int,
        deadline: float,
        superseded: Callable[[], bool],
    ) -> list[SnapshotPart] | str:
        written = self._parts.get((group, at.step, at.token), {})
        failed = [p.error for p in written.values() if p.error]
        if failed:
            return failed[0]
        missing = [i for i in range(parts) if i not in written]
        if missing:
            return f"{len(missing)} part(s) missing"
        return [written[i] for i in range(parts)]

    def say(self, key: str, record: SnapshotRecord) -> None:
        log.info("snapshot %s: %s", key.rsplit("/", 2)[-2], record)

    def forget_parts(self, group: str, at: SnapshotAt) -> None:
        self._parts.pop((group, at.step, at.token), None)

    def close(self) -> None:
        pass


class StoreCoordination(Coordination):
    """Through the job's store (``store()``: the worker's own client, None while it has
    none)."""

    def __init__(self, keys: JobKeys, store: Callable[[], KVStore | None], patience: float):
        self._keys = keys
        self._store = store
        self._patience = patience
        self._target: SnapshotAt | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._following = False

    def follow(self) -> None:
        """Follow the snapshot requests from now on (once the worker has a store)."""
        store = self._store()
        with self._lock:
            if self._following or store is None:
                return
            self._following = True
        follow_in_thread(
            "elastic-snapshot-at",
            store,
            self._keys.snapshot_at,
            on_event=lambda e: self._take(e.value) if e.type == PUT else None,
            on_resync=self._take_all,
            on_lost=lambda exc: log.warning("stopped following snapshot requests: %s", exc),
            stop=self._stop,
            patience=self._patience,
        )

    def _take_all(self, kvs: Sequence[KeyValue]) -> None:
        for kv in kvs:
            self._take(kv.value)

    def _take(self, value: bytes) -> None:
        try:
            at = SnapshotAt.from_json(value)
        except (ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable snapshot request: %s", exc)
            return
        with self._lock:
            current = self._target
            if current is None or (at.round_id, at.step) >= (current.round_id, current.step):
                self._target = at

    def target(self) -> SnapshotAt | None:
        with self._lock:
            return self._target

    def ask(self, at: SnapshotAt) -> None:
        self._take(at.to_json())  # rank 0 need not wait for its own watch
        self._put_aside("elastic-snapshot-ask", self._keys.snapshot_at, at.to_json())

    def part_written(self, group: str, at: SnapshotAt, part: SnapshotPart) -> None:
        # (aside: the writer's thread must not wait on a store that stalls; the next
        # snapshot, written alone meanwhile, would wait behind it)
        key = self._keys.snapshot_part(group, at.step, at.token, part.part)
        self._put_aside("elastic-snapshot-part", key, part.to_json())

    def _put_aside(self, name: str, key: str, value: bytes) -> None:
        """``_put`` in a thread of its own (the caller goes on at once)."""
        threading.Thread(target=self._put, args=(key, value), name=name, daemon=True).start()

    def say(self, key: str, record: SnapshotRecord) -> None:
        self._put(key, record.to_json())

    def _put(self, key: str, value: bytes) -> None:
        store = self._store()
        if store is None:
            return
        try:
            store.put(key, value)
        except RendezvousError as exc:  # a report: the snapshot itself is on disk
            log.warning("could not write %s: %s", key, exc)

    def wait_parts(
        self,
        group: str,
        at: SnapshotAt,
        parts: int,
        deadline: float,
        superseded: Callable[[], bool],
    ) -> list[SnapshotPart] | str:
        store = self._store()
        if store is None:
            return "no store"
        prefix = self._keys.snapshot_parts(group, at.step, at.token)
        seen: dict[int, SnapshotPart] = {}

        def take(kvs: list[KeyValue]) -> str | None:
            for kv in kvs:
                try:
                    part = SnapshotPart.from_json(kv.value)
                except (ValueError, TypeError):
                    continue
                if part.error:
                    return f"part {part.part}: {part.error}"
                if 0 <= part.part < parts:
                    seen[part.part] = part
            return None

        try:
            kvs, watch = store.read_and_watch(prefix)
        except RendezvousError as exc:
            return f"cannot follow the parts: {exc}"
        try:
            why = take(list(kvs))
            while why is None and len(seen) < parts:
                if self._stop.is_set():
                    return "the worker is shutting down"
                if superseded():
                    return f"{parts - len(seen)} of {parts} parts missing when a new round came"
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return f"{parts - len(seen)} of {parts} parts not written in time"
                try:
                    event: Event | None = watch.get(timeout=min(remaining, 1.0))
                except RendezvousError as exc:
                    return f"lost the parts' records: {exc}"
                if event is not None and event.type == PUT:
                    why = take([event.kv])
            return why if why is not None else [seen[i] for i in range(parts)]
        finally:
            watch.cancel()

    def forget_parts(self, group: str, at: SnapshotAt) -> None:
        store = self._store()
        if store is None:
            return
        try:
            store.delete_prefix(self._keys.snapshot_parts(group, at.step, at.token))
        except RendezvousError as exc:
            log.debug("could not delete the parts' records: %s", exc)

    def close(self) -> None:
        self._stop.set()
