"""What the ps supervisor's queue carries (``driver.ps.supervisor``): the news its
threads post (a shard's records from the store, a process's exit), and what its own
I/O found out (a process started, the answer of a failover).

The rules (``driver.ps.rules``) decide on each one; none of them holds a process
handle, only pids, so the rules stay pure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from rendezvous.schema.ps import ReplicaRecord, ShardInfo


class Role(enum.Enum):
    """Which of a shard's processes: the one that serves it, or its backup
    (``--ps-replicas 1``)."""

    PRIMARY = "primary"
    BACKUP = "backup"


@dataclass(frozen=True)
class Handover:
    """A shard given to its backup: the address of the primary that died (``dead``) and
    of the backup that takes over (``backup``)."""

    dead: str
    backup: str


@dataclass(frozen=True)
class Launched:
    """The supervisor started process ``pid`` as shard ``index``'s ``role`` on ``host``."""

    index: int
    role: Role
    pid: int
    host: str


@dataclass(frozen=True)
class Adopted:
    """A process a driver that led the job before started (``pid`` on ``host``) is shard
    ``index``'s ``role`` now; a primary served its predecessor, so it counts as ready."""

    index: int
    role: Role
    pid: int
    host: str


@dataclass(frozen=True)
class PrimaryRecord:
    """A shard's ``ShardInfo`` (``JobKeys.ps_shard``), as the store has it now."""

    info: ShardInfo


@dataclass(frozen=True)
class BackupRecord:
    """A backup's ``ShardInfo`` (``JobKeys.ps_backup``)."""

    info: ShardInfo


@dataclass(frozen=True)
class ReplicaSeen:
    """A shard's ``ReplicaRecord`` (``JobKeys.ps_replica``): whom it counts as its backup
    in step, and who serves it."""

    record: ReplicaRecord


@dataclass(frozen=True)
class Exited:
    """Process ``pid`` of shard ``index`` ended with ``code``."""

    index: int
    pid: int
    code: int | None


@dataclass(frozen=True)
class FailOverAnswer:
    """What the store said to a failover of shard ``index`` (``rules.TryFailOver``):
    the backup took it over (``handover``), or None: it cannot, restart the shard."""

    index: int
    handover: Handover | None


@dataclass(frozen=True)
class Fatal:
    """The shards cannot go on (the store unreachable too long, a shard that cannot be
    started again, a promotion whose outcome is unknown)."""

    reason: str


@dataclass(frozen=True)
class Stop:
    """The supervisor stops: from here no process is started, and no exit is news."""


Message = Union[
    Launched,
    Adopted,
    PrimaryRecord,
    BackupRecord,
    ReplicaSeen,
    Exited,
    FailOverAnswer,
    Fatal,
    Stop,
]
