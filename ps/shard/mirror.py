"""A primary's side of its backup (``--ps-replicas 1``): every change of the shard's
state is queued here in the order it was made (``record``, called under the state
lock), sent to the backup in that order by one thread, and a reply to a client waits
until the backup holds every change made before the reply was computed (``wait``). So a
push is acknowledged only once its update is on both processes; a push the primary
applied but could not mirror is never acknowledged (its client retries, and the
de-duplication table, mirrored too, keeps a repeated async push from applying twice).

Who holds the shard is the ``ReplicaRecord`` in the store, changed by compare-and-swap
only (``StoreRegistry.swap_replica``):

* a backup attaches (``attach``): its first update is a FULL copy of the state, taken
  under the state lock so that no change falls between the copy and the queue; once the
  backup holds it, the primary names the backup in the record: from then on the driver
  may promote it when the primary dies;
* a backup that does not answer for ``mirror_patience`` seconds, or refuses an update,
  is dropped: the primary first writes the record without it, and only then
  acknowledges anything alone. If that write loses, the driver has promoted the backup
  (it believed this primary dead): this primary is *deposed*, refuses every call from
  then on (``on_deposed``), and acknowledges nothing more. The driver's promotion and
  the primary's drop are compare-and-swaps on one record, so only one of them wins.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable

from ps.client.link import LinkSettings, ShardLink
from ps.errors import (
    RETRYABLE,
    PSError,
    PSNotReadyError,
    PSWrongShardError,
)
from ps.protocol import MirrorArgs, Mirrored
from ps.registry import StoreRegistry
from ps.settings import ServerSettings
from ps.shard.journal import Op, encode
from ps.shard.state import ShardState
from rendezvous.errors import RendezvousError
from rendezvous.retry import Backoff
from rendezvous.schema.ps import ReplicaRecord

log = logging.getLogger("ps.shard.mirror")

BATCH_BYTES = 64 << 20  # one mirror call carries updates up to about this size
LANES = 4  # parts of a large mirror call in flight at once (as a client's push)


@dataclass(eq=False)
class _Target:
    """One attached backup: where it is, the token of its copy, and whether the replica
    record names it (it holds the state: the driver may promote it)."""

    address: str
    token: str
    link: ShardLink
    named: bool = False


class Mirror:
    """The backup of ``state`` (shard ``settings.index``, served at ``address()``), its
    record in ``registry``. ``on_deposed(reason)``: the driver promoted the backup."""

    def __init__(
        self,
        settings: ServerSettings,
        secret: str,
        state: ShardState,
        registry: StoreRegistry,
        address: Callable[[], str | None],
        on_deposed: Callable[[str], None],
    ):
        self.settings = settings
        self._secret = secret
        self._state = state
        self._registry = registry
        self._address = address
        self._on_deposed = on_deposed
        self._cond = threading.Condition()
        # Held across each write of the replica record and what it must be atomic with
        # (taken before the state lock and ``_cond``, never while holding them).
        self._writing = threading.Lock()
        self._seq = 0  # the last update queued
        self._acked = 0  # every update up to it is on the backup (or there is none)
        self._queue: deque[tuple[int, Op]] = deque()
        self._target: _Target | None = None
        self._revision = 0  # of this primary's last write of the replica record
        self._deposed: str | None = None
        self._stop = threading.Event()
        self._parts = ThreadPoolExecutor(LANES, thread_name_prefix="ps-mirror-part")
        self._thread = threading.Thread(target=self._run, name="ps-mirror", daemon=True)

    # ---------------------------------------------------------------- the record
    def _record_of(self, backup: str) -> ReplicaRecord:
        return ReplicaRecord(self.settings.index, str(self._address()), backup, self._state.step)

    def serve(self) -> None:
        """This process serves the shard (a fresh primary): say so in the record, with
        no backup yet, and start sending to backups. Raises RendezvousError."""
        self._revision = self._registry.put_replica(self._record_of(""))
        self._thread.start()

    def promoted(self, revision: int) -> None:
        """This process was a backup and took over the shard, writing the record at
        ``revision``: start sending to backups."""
        self._revision = revision
        self._thread.start()

    def _swap(self, backup: str) -> bool:
        """Write the record naming ``backup`` ("": none); False when the driver changed
        it (this primary is deposed). Raises RendezvousError (store unreachable)."""
        record = self._record_of(backup)
        revision = self._registry.swap_replica(record, self._revision)
        if revision is None:
            current = self._registry.replica(self.settings.index)
            self._depose(
                "the driver gave ps shard "
                f"{self.settings.index} to {current[0].primary if current else 'another process'}"
            )
            return False
        self._revision = revision
        return True

    def _depose(self, reason: str) -> None:
        with self._cond:
            if self._deposed is not None:
                return
            self._deposed = reason
            self._cond.notify_all()
        log.warning("ps shard %d: no longer serving: %s", self.settings.index, reason)
        self._on_deposed(reason)

    # ---------------------------------------------------------------- the queue
    def record(self, op: Op) -> None:
        """Queue one change (``ShardState.journal``: called under the state lock, in
        the order of the changes)."""
        with self._cond:
            if self._target is None:
                return
            self._seq += 1
            self._queue.append((self._seq, op))
            self._cond.notify_all()

    def last(self) -> int:
        """The number of the newest change queued."""
        with self._cond:
            return self._seq

    def wait(self, seq: int, timeout: float) -> None:
        """Return once the backup holds every change up to ``seq`` (or none is needed).

        Raises:
            PSWrongShardError: this primary was deposed (the client moves on).
            PSNotReadyError: not within ``timeout`` (the client asks again)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._acked < seq:
                if self._deposed is not None:
                    raise PSWrongShardError(
                        f"this process no longer serves ps shard {self.settings.index}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PSNotReadyError(
                        f"the backup of ps shard {self.settings.index} did not "
                        f"acknowledge an update within {timeout:.0f}s"
                    )
                self._cond.wait(left)

    @property
    def deposed(self) -> str | None:
        return self._deposed

    # ---------------------------------------------------------------- backups
    def attach(self, address: str, token: str, incarnation: str | None) -> None:
        """A backup at ``address`` (its process ``incarnation``; None: asked of it)
        asks for the state, as copy ``token``: it replaces any other (the driver runs
        one backup per shard; a named one is dropped from the record first, so the
        record never names a backup that misses updates).

        Raises:
            PSWrongShardError: this primary was deposed.
            PSNotReadyError: the store did not take the drop of a named backup."""
        if self._deposed is not None:
            raise PSWrongShardError(f"this process no longer serves ps shard {self.settings.index}")
        link = ShardLink(
            self.settings.index,
            address,
            self._secret,
            LinkSettings(LANES, timeout=self.settings.mirror_timeout),
            pool=self._parts,
            incarnation=incarnation,
        )

        def start(full: Op) -> None:  # under the state lock: nothing changes meanwhile
            with self._cond:
                old, self._target = self._target, _Target(address, token, link)
                self._seq += 1
                self._queue = deque([(self._seq, full)])
                self._cond.notify_all()
            if old is not None:
                old.link.close()

        with self._writing:  # no naming of the old backup between its drop and the new one
            current = self._target
            if current is not None and not self._drop_locked(
                current, f"a new backup at {address} replaces it"
            ):
                link.close()
                raise PSNotReadyError(
                    f"ps shard {self.settings.index} cannot drop its backup from the store yet"
                )
            self._state.copy_to(start)
        log.info("ps shard %d: a backup at %s copies the state", self.settings.index, address)

    def _drop(self, target: _Target, why: str) -> bool:
        """Stop mirroring to ``target`` (if it is still the backup); a named one leaves
        the record first. False when that write failed (the store is unreachable: the
        caller tries again later)."""
        with self._writing:
            return self._drop_locked(target, why)

    def _drop_locked(self, target: _Target, why: str) -> bool:
        with self._cond:
            if self._target is not target:
                return True  # replaced or dropped already
        if target.named:
            try:
                if not self._swap(""):
                    return True  # deposed: nothing more is acknowledged anyway
            except RendezvousError as exc:
                log.warning("ps shard %d: cannot drop its backup yet: %s", self.settings.index, exc)
                return False
            target.named = False
        with self._cond:
            if self._target is target:
                self._target = None
                self._queue.clear()
                self._acked = self._seq
                self._cond.notify_all()
        target.link.close()
        log.warning(
            "ps shard %d: backup at %s dropped (%s); serving alone",
            self.settings.index,
            target.address,
            why,
        )
        return True

    def _name(self, target: _Target) -> None:
        """The backup holds the state: name it in the record (the store unreachable:
        tried again after the next update)."""
        with self._writing:
            with self._cond:
                if self._target is not target:
                    return
            try:
                if self._swap(target.address):
                    target.named = True
                    log.info(
                        "ps shard %d: backup at %s holds its state (step %d)",
                        self.settings.index,
                        target.address,
                        self._state.step,
                    )
            except RendezvousError as exc:
                log.warning("ps shard %d: backup not recorded yet: %s", self.settings.index, exc)

    # ---------------------------------------------------------------- sending
    def _batch(self) -> tuple[_Target, list[tuple[int, Op]]] | None:
        """The target and the updates to send next (None: stopping)."""
        with self._cond:
            while not self._stop.is_set() and self._deposed is None:
                target = self._target
                if target is not None and self._queue:
                    batch: list[tuple[int, Op]] = []
                    size = 0
                    for seq, op in self._queue:
                        if batch and size >= BATCH_BYTES:
                            break
                        batch.append((seq, op))
                        size += sum(a.nbytes for _, a in op.tensors)
                    return target, batch
                self._cond.wait()
            return None

    def _send(self, target: _Target, batch: list[tuple[int, Op]]) -> int:
        """One mirror call, retried for ``mirror_patience`` while the backup is not
        there; the last update it holds.

        Raises:
            PSReplicaError: it refuses the updates.
            PSError, RendezvousError: it stayed unreachable, or answered with an error."""
        heads, payload = encode([Op(replace(op.head, seq=seq), op.tensors) for seq, op in batch])
        args = MirrorArgs(target.token, heads)
        s = self.settings
        backoff = Backoff.within(s.mirror_patience, initial=0.02, cap=0.25, stop=self._stop)
        while True:
            try:
                header, _ = target.link.request("Mirror", args, payload, s.mirror_timeout)
                return Mirrored.from_dict(header).seq
            except RETRYABLE:
                if self._target is not target or not backoff.pause():
                    raise

    def _run(self) -> None:
        while True:
            got = self._batch()
            if got is None:
                return
            target, batch = got
            try:
                acked = self._send(target, batch)
            except Exception as exc:  # whatever failed, this backup has not got the updates
                if not isinstance(exc, (PSError, RendezvousError)):
                    # e.g. its link closed under the call when a new backup replaced it
                    log.debug("mirror call to %s failed", target.address, exc_info=True)
                if self._target is target and not self._drop(target, str(exc)):
                    self._stop.wait(self.settings.mirror_patience)
                continue
            with self._cond:
                if self._target is target:
                    while self._queue and self._queue[0][0] <= acked:
                        self._queue.popleft()
                    self._acked = max(self._acked, min(acked, self._seq))
                    self._cond.notify_all()
            if not target.named:
                self._name(target)

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
            target, self._target = self._target, None
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if target is not None:
            target.link.close()
        self._parts.shutdown(wait=False)
