"""Where shards are found: their records (and, for sync workers, the current round) in
the rendezvous store of the job.

A shard writes its ``rendezvous.schema.ps.ShardInfo`` under ``JobKeys(job_id).ps_shard(i)``
as soon as it serves (``ready`` False: it may still be restoring, and data calls
answer "not ready" until it is), and again with ``ready`` True once restored; a
restarted shard overwrites its key (with its new address and incarnation: a call's
proof of the secret is made for one shard process), and clients and peers re-read it
after a failure.
Shard 0 writes a ``CheckpointRecord`` under ``JobKeys.ps_checkpoint`` after each
complete coordinated checkpoint, and a ``CheckpointFailedRecord`` under
``JobKeys.ps_checkpoint_failed`` when checkpoints fail (``ps.shard.failures``).
Under ``--ps-replicas 1`` a backup writes its ``ShardInfo`` under
``JobKeys.ps_backup(i)`` instead, and who holds each shard is a ``ReplicaRecord`` under
``JobKeys.ps_replica(i)``, changed by compare-and-swap only. A shard that restored an
older state than the shards had reached says so with a ``RollbackRecord`` under
``JobKeys.ps_rollback``.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from ps.errors import PSConfigError
from rendezvous import env, open_store
from rendezvous.errors import RendezvousConnectionError
from rendezvous.keys import JobKeys
from rendezvous.schema.ps import (
    CheckpointFailedRecord,
    CheckpointRecord,
    PSConfigRecord,
    ReplicaRecord,
    RollbackRecord,
    ShardInfo,
)
from rendezvous.schema.rounds import Plan
from rendezvous.store import PUT, Compare, Put, Watch


class StoreRegistry:
    """Shard records in the store of job ``job_id`` (the registry owns ``store``)."""

    def __init__(self, store, job_id: str):
        self.store = store
        self.keys = JobKeys(job_id)

    def publish(self, info: ShardInfo) -> None:
        """Raises RendezvousError when the store stays unreachable past its deadline."""
        self.store.put(self.keys.ps_shard(info.index), info.to_json())

    def publish_checkpoint(self, record: CheckpointRecord) -> None:
        """Raises RendezvousError when the store stays unreachable past its deadline."""
        self.store.put(self.keys.ps_checkpoint, record.to_json())

    def publish_checkpoint_failure(self, record: CheckpointFailedRecord) -> None:
        """Raises RendezvousError when the store stays unreachable past its deadline."""
        self.store.put(self.keys.ps_checkpoint_failed, record.to_json())

    def publish_backup(self, info: ShardInfo) -> None:
        """A backup's record. Raises RendezvousError (store unreachable past its deadline)."""
        self.store.put(self.keys.ps_backup(info.index), info.to_json())

    def publish_rollback(self, record: RollbackRecord) -> None:
        """Raises RendezvousError when the store stays unreachable past its deadline."""
        self.store.put(self.keys.ps_rollback, record.to_json())

    def replica(self, index: int) -> tuple[ReplicaRecord, int] | None:
        """Shard ``index``'s replica record and its mod revision (None: none yet).
        Raises RendezvousError."""
        kv = self.store.get(self.keys.ps_replica(index))
        return (ReplicaRecord.from_json(kv.value), kv.mod_revision) if kv is not None else None

    def put_replica(self, record: ReplicaRecord) -> int:
        """Write the record whatever is there (a primary's first); its mod revision.
        Raises RendezvousError."""
        return self.store.put(self.keys.ps_replica(record.index), record.to_json())

    def swap_replica(self, record: ReplicaRecord, expected: int) -> int | None:
        """Write the record only if its key's mod revision is still ``expected``: the
        new mod revision, or None when another write came first. When the store's
        answer is lost, the key is read to learn which it was.

        Raises:
            RendezvousError: the store stayed unreachable, or did not apply a write
                whose answer was lost (the caller may try again)."""
        key = self.keys.ps_replica(record.index)
        try:
            result = self.store.txn(
                [Compare(key, "mod", "==", expected)], [Put(key, record.to_json())]
            )
        except RendezvousConnectionError:
            kv = self.store.get(key)
            if kv is not None and ReplicaRecord.from_json(kv.value) == record:
                return kv.mod_revision
            if kv is None or kv.mod_revision == expected:
                raise
            return None
        return result.revision if result.succeeded else None

    def watch_replica(self, index: int) -> tuple[list, Watch]:
        """Shard ``index``'s replica record now (a list of at most one), and a watch of
        every change after it. Raises RendezvousError."""
        return self.store.read_and_watch(self.keys.ps_replica(index))

    def lookup(self, index: int) -> ShardInfo | None:
        """The record shard ``index`` published last (None: not yet): its address and
        the incarnation a call's proof is made for. Raises RendezvousError when the
        store stays unreachable past its deadline."""
        kv = self.store.get(self.keys.ps_shard(index))
        return ShardInfo.from_json(kv.value) if kv is not None else None

    def shards(self) -> dict[int, ShardInfo]:
        """Every shard's record, by index. Raises RendezvousError."""
        kvs, _ = self.store.get_prefix(self.keys.ps)
        infos = (ShardInfo.from_json(kv.value) for kv in kvs)
        return {info.index: info for info in infos}

    def wait_all(self, timeout: float) -> list[ShardInfo]:
        """Every shard's record (address and incarnation), in index order, once all
        have published (ready or still restoring: clients retry until it serves).

        Raises:
            PSConfigError: the job runs no shards (the driver says so under
                ``JobKeys.ps_config``: at once), none has published within
                ``timeout``, or some are still missing then.
            RendezvousError: the store stayed unreachable."""
        config = self.store.get(self.keys.ps_config)
        if config is not None and PSConfigRecord.from_json(config.value).num_shards == 0:
            raise PSConfigError(
                "this job runs no parameter-server shards: start it with elastic-run --num-ps N"
            )
        deadline = time.monotonic() + timeout
        kvs, watch = self.store.read_and_watch(self.keys.ps)
        with watch:
            shards = {info.index: info for info in (ShardInfo.from_json(kv.value) for kv in kvs)}
            while True:
                if shards:
                    n = next(iter(shards.values())).num_shards
                    if all(i in shards for i in range(n)):
                        return [shards[i] for i in range(n)]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                event = watch.get(timeout=remaining)
                if event is not None and event.type == PUT:
                    info = ShardInfo.from_json(event.value)
                    shards[info.index] = info
        if not shards:
            raise PSConfigError(
                f"this job has no parameter-server shards: nothing under "
                f"{self.keys.ps} after {timeout:.0f}s (start it with elastic-run --num-ps N)"
            )
        n = next(iter(shards.values())).num_shards
        raise PSConfigError(
            f"only shards {sorted(shards)} of {n} published an address "
            f"under {self.keys.ps} within {timeout:.0f}s"
        )

    def close(self) -> None:
        self.store.close()


def registry_from_env(environ=os.environ) -> StoreRegistry | None:
    """The job's registry when ``ELASTIC_RENDEZVOUS`` and ``ELASTIC_JOB_ID`` are set,
    else None. Raises RendezvousError subclasses when the store cannot be opened."""
    url, job_id = environ.get(env.ENV_RENDEZVOUS), environ.get(env.ENV_JOB_ID)
    if not url or not job_id:
        return None
    return StoreRegistry(open_store(url, environ.get(env.ENV_SECRET)), job_id)


def store_round_hooks(
    store, job_id: str, worker_id: str
) -> tuple[Callable[[], tuple[int, int, int] | None], Callable[[int], bool]]:
    """``(round_source, newer_round)`` read from the job's published plan: the round
    this worker is a member of (id, size, rank), and whether a round newer than a given
    id has been published."""
    keys = JobKeys(job_id)

    def plan() -> Plan | None:
        kv = store.get(keys.round)
        return Plan.from_json(kv.value) if kv is not None else None

    def round_source() -> tuple[int, int, int] | None:
        p = plan()
        member = p.member(worker_id) if p is not None else None
        if p is None or member is None:
            return None
        return p.round_id, p.size, member.rank

    def newer_round(round_id: int) -> bool:
        p = plan()
        return p is not None and p.round_id > round_id

    return round_source, newer_round
