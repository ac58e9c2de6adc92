"""A backup's side (``--ps-replicas 1``): the second process of shard I, started as
``python -m ps.server --index I ... --backup``. It serves no client (its record
goes under ``JobKeys.ps_backup(I)``, never ``ps_shard(I)``; data calls reaching it are
refused as meant for another shard) and follows shard I's ``ReplicaRecord``:

* it attaches to the primary the record names, once that one serves (``Attach``), and
  receives a FULL copy of its state, then every update in the order the primary made
  it (``Mirror``, see ``mirror.py``): it replays each (``ShardState.replay``) before it
  acknowledges it, so when the primary acknowledges a push this process holds it;
* when the driver promotes it (the record names it primary, not serving yet: its
  primary died while the record named this backup in step), it refuses updates from
  then on, writes the record as the serving primary with its step, and
  ``on_promoted`` makes it shard I (published under ``ps_shard(I)``). It took every
  acknowledged update, so no step is lost and no shard rolls back;
* a backup the record named and then no longer names was dropped by its primary: it
  exits (``on_dropped``), and the driver starts another. One the record has not named
  yet follows whichever primary the record names (one restarted from a checkpoint), and
  asks again when no copy came within ``ATTACH_PATIENCE``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from ps.client.link import ShardLink
from ps.errors import PSError, PSReplicaError
from ps.protocol import FULL, AttachArgs, MirrorArgs, Mirrored
from ps.registry import StoreRegistry
from ps.settings import ServerSettings
from ps.shard.journal import decode
from ps.shard.state import ShardState
from rendezvous.errors import RendezvousError
from rendezvous.schema.ps import ReplicaRecord, ShardInfo
from rendezvous.store import PUT, KeyValue

log = logging.getLogger("ps.shard.backup")

ATTACH_PATIENCE = 5.0  # seconds an attached backup waits for its copy before asking again
_TICK = 0.5  # how often the follower looks at a pending attach without a record change


@dataclass(frozen=True)
class BackupHooks:
    """What a backup asks of, and tells, its server: ``address()`` where it serves,
    ``info(ready)`` its record; ``on_promoted(revision)``: it took the shard over, writing
    the replica record at ``revision``; ``on_dropped(reason)``: its primary dropped it."""

    address: Callable[[], str | None]
    info: Callable[[bool], ShardInfo]
    on_promoted: Callable[[int], None]
    on_dropped: Callable[[str], None]


class Backup:
    """The backup of shard ``settings.index``: ``state`` is its copy, ``registry`` the
    store, ``hooks`` its server's side (see ``BackupHooks``)."""

    def __init__(
        self,
        settings: ServerSettings,
        secret: str,
        state: ShardState,
        registry: StoreRegistry,
        hooks: BackupHooks,
    ):
        self.settings = settings
        self._secret = secret
        self._state = state
        self._registry = registry
        self._address = hooks.address
        self._info = hooks.info
        self._on_promoted = hooks.on_promoted
        self._on_dropped = hooks.on_dropped
        self._lock = threading.Lock()  # the copy's fields below
        self._token: str | None = None  # the copy being received
        self._last = 0  # the number of the last update replayed (0: no copy yet)
        self._active = True  # False once promoted (or dropped): updates are refused
        self._primary: str | None = None  # the primary attached to
        self._heard = 0.0  # when it attached, or last received updates
        self._named = False  # the record named this backup in step
        self._announced = False  # its record says it holds a copy
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="ps-backup", daemon=True)

    def start(self) -> None:
        """Publish this backup's record and follow the shard's replica record.
        Raises RendezvousError (store unreachable)."""
        self._registry.publish_backup(self._info(False))
        self._thread.start()

    # ---------------------------------------------------------------- updates
    def handle(self, args: MirrorArgs, body) -> Mirrored:
        """One ``Mirror`` call: replay its new updates in order.

        Raises:
            PSReplicaError: not (or no longer) a backup of that copy, an update missing
                before these, or a copy that disagrees with its primary's."""
        ops = decode(args, body)
        self._heard = time.monotonic()
        with self._lock:
            if not self._active or args.token != self._token:
                raise PSReplicaError(
                    f"this process is no backup of ps shard {self.settings.index} for that copy"
                )
            for op in ops:
                seq = op.head.seq
                if seq <= self._last:
                    continue  # sent again after a lost answer
                if self._last == 0 and op.head.kind != FULL:
                    raise PSReplicaError(f"update {seq} came before the copy it follows")
                if self._last and seq != self._last + 1:
                    raise PSReplicaError(f"update {seq} came after {self._last}")
                self._state.replay(op)
                self._last = seq
            announce = self._last > 0 and not self._announced
            self._announced = self._announced or announce
            last = self._last
        if announce:
            try:
                self._registry.publish_backup(self._info(True))
            except RendezvousError as exc:
                log.warning("backup record not updated: %s", exc)
        return Mirrored(last)

    # ---------------------------------------------------------------- the record
    def _follow(self) -> None:
        key = self._registry.keys.ps_replica(self.settings.index)
        while not self._stop.is_set():
            try:
                kvs, watch = self._registry.watch_replica(self.settings.index)
            except RendezvousError as exc:
                log.warning("cannot follow the replica record: %s", exc)
                self._stop.wait(_TICK)
                continue
            with watch:
                latest = next((kv for kv in kvs if kv.key == key), None)
                try:
                    while not self._stop.is_set():
                        if latest is not None:
                            self._consider(latest)
                        event = watch.get(timeout=_TICK)
                        if event is not None and event.type == PUT and event.key == key:
                            latest = event.kv
                except RendezvousError as exc:
                    log.warning("the replica record's watch ended: %s", exc)

    def _consider(self, kv: KeyValue) -> None:
        record = ReplicaRecord.from_json(kv.value)
        me = self._address()
        if record.primary == me:
            if not record.serving and self._active:
                self._promote(kv.mod_revision)
            return
        if not self._active:
            return
        if record.backup == me:
            if not self._named:
                self._named = True
                log.info("in step with ps shard %d at %s", self.settings.index, record.primary)
            return
        if self._named:
            self._drop(f"ps shard {self.settings.index}'s primary at {record.primary} dropped it")
            return
        if record.serving and (
            record.primary != self._primary or time.monotonic() - self._heard > ATTACH_PATIENCE
        ):
            self._attach(record.primary)

    def _attach(self, primary: str) -> None:
        token = uuid.uuid4().hex
        with self._lock:
            self._token, self._last, self._primary = token, 0, primary
            self._heard = time.monotonic()
        # The replica record names the primary by address only: its incarnation is
        # asked of it (a proof for the process serving there now is all Attach needs).
        link = ShardLink(self.settings.index, primary, self._secret)
        me = self._info(False)
        try:
            link.request("Attach", AttachArgs(me.address, token, me.incarnation), timeout=10.0)
        except (PSError, RendezvousError) as exc:
            log.info(
                "ps shard %d at %s did not take this backup yet: %s",
                self.settings.index,
                primary,
                exc,
            )
            with self._lock:
                self._primary = None  # asked again at the next record or tick
        finally:
            link.close()

    def _drop(self, reason: str) -> None:
        with self._lock:
            self._active = False
        self._stop.set()
        self._on_dropped(reason)

    def _promote(self, revision: int) -> None:
        """Take the shard over: refuse updates, then write the record as the serving
        primary (compare-and-swap on the driver's write)."""
        with self._lock:
            self._active = False
            copied = self._last > 0
        if not copied:  # never: the driver promotes only a backup the record named in step
            self._drop("promoted without a copy of the shard")
            return
        me, step = str(self._address()), self._state.step
        record = ReplicaRecord(self.settings.index, me, "", step, serving=True)
        for _ in range(3):
            try:
                written = self._registry.swap_replica(record, revision)
            except RendezvousError as exc:
                log.warning("taking ps shard %d over: %s", self.settings.index, exc)
                continue
            if written is None:
                self._drop("the replica record changed while this backup took over")
                return
            self._stop.set()
            log.info("took over ps shard %d at step %d", self.settings.index, step)
            self._on_promoted(written)
            return
        self._drop("the store did not take this backup's promotion")

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
