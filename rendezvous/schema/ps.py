"""The parameter-server shards' records: each shard's address (``ShardInfo``), their
coordinated checkpoints (``CheckpointRecord``, ``CheckpointFailedRecord``), what the
driver started of them (``PSConfigRecord``), who holds a replicated shard
(``ReplicaRecord``) and a step lost to a restart (``RollbackRecord``)."""

from __future__ import annotations

from dataclasses import dataclass

from rendezvous.schema.record import JsonRecord


@dataclass(frozen=True)
class ShardInfo(JsonRecord):
    """A parameter-server shard's record under ``JobKeys.ps_shard(index)`` (written by
    the shard). ``ready`` is False while it restores a checkpoint (data calls answer
    "not ready" meanwhile) and True once it serves; the driver's supervisor waits for
    it, clients only need the address and the incarnation: calls must prove the secret
    for that process (``rendezvous.net.auth``), so one replayed to a later process at
    the address, after a restart, is refused."""

    index: int
    num_shards: int
    address: str
    pid: int
    ready: bool = False
    bulk_address: str = ""  # the shard's bulk-bytes TCP port, when it has one
    incarnation: str = ""  # of the shard process ("": a shard of an older release)


@dataclass(frozen=True)
class CheckpointRecord(JsonRecord):
    """The newest complete coordinated checkpoint, under ``JobKeys.ps_checkpoint``
    (written by the coordinating shard once every shard's files and the manifest are
    durable). ``pause_ms`` is how long training was held, ``write_ms`` the write.
    ``final``: the coordinating shard stops, and this checkpoint holds the state the
    shards stop with (it may be a checkpoint announced before, when nothing changed
    since)."""

    checkpoint_id: int
    step: int
    dir: str
    pause_ms: float = 0.0
    write_ms: float = 0.0
    final: bool = False


@dataclass(frozen=True)
class CheckpointFailedRecord(JsonRecord):
    """Coordinated ps checkpoints fail, under ``JobKeys.ps_checkpoint_failed`` (written
    by the coordinating shard at the first failure of a streak, then at most once a
    minute while the failures go on, and always when ``final``). ``checkpoint_id``: the
    attempt that failed last, of the shards' ``step`` (None: not known, the attempt
    ended before the shards said); ``error``: why, in one line; ``attempts``: failed
    attempts in a row so far; ``final``: it was the checkpoint the shards stop with, so
    their state since ``newest`` (the newest complete checkpoint, of ``newest_step``;
    None: there is none) is lost when they stop."""

    checkpoint_id: int
    step: int | None
    dir: str
    error: str
    attempts: int = 1
    final: bool = False
    newest: int | None = None
    newest_step: int | None = None


@dataclass(frozen=True)
class PSConfigRecord(JsonRecord):
    """What the driver started of parameter servers, under ``JobKeys.ps_config``:
    ``num_shards`` (0: the job runs none) and their ``mode``."""

    num_shards: int
    mode: str = ""


@dataclass(frozen=True)
class ReplicaRecord(JsonRecord):
    """Who holds ps shard ``index`` under ``--ps-replicas 1``, under
    ``JobKeys.ps_replica(index)``: ``primary``, the address of the process that serves
    it, and ``backup``, the address of the process that holds a copy of its state and
    acknowledges every update before the primary acknowledges it ("": none in step).
    ``step``: the shard's global step when the record was written.

    Every write but a primary's first is a compare-and-swap on the revision its writer
    read, so two writers never both win. The primary writes it when it serves, when a
    backup has copied its state, and before it acknowledges anything without the backup
    it had (its backup is gone). The driver writes it to promote the backup of a primary
    that died: ``primary`` the backup, ``backup`` "", ``serving`` False until the backup
    has taken over (it then writes the record again, ``serving`` True, with its step).
    So a backup is promoted only while the record says it is in step."""

    index: int
    primary: str
    backup: str = ""
    step: int = 0
    serving: bool = True


@dataclass(frozen=True)
class RollbackRecord(JsonRecord):
    """The ps shards went back to an older state than the one they had reached, under
    ``JobKeys.ps_rollback`` (written by the shard that saw it: the coordinating shard in
    sync mode, the restarted shard in async mode). ``shard``: the shard whose restart
    caused it; ``from_step``: the step the other shards had reached; ``to_step``: the
    step restored (``checkpoint``: from that checkpoint; None: the empty start)."""

    shard: int
    from_step: int
    to_step: int
    checkpoint: int | None = None
