"""The records that travel through the store: worker registrations, round plans, the
workers' failure reports, and the driver's and the ps shards' records.

The driver is the only writer of plans; workers read them. Both sides share these
classes so the JSON schema is defined once: every record is written with ``to_json``
and read with ``from_json``, never as a bare dict.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Protocol, TypeVar

R = TypeVar("R", bound="JsonRecord")


@dataclass(frozen=True)
class WorkerInfo:
    """A worker's registration (written by the worker under its lease).

    ``worker_id`` is unique for the life of the job (a replacement gets a new one);
    ``address`` is the data-plane listener ``host:port`` its peers connect to."""

    worker_id: str
    host: str
    slot: int
    pid: int
    address: str

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> WorkerInfo:
        return cls(**json.loads(data))


SNAPSHOT_NOW = "now"
SNAPSHOT_FINAL = "final"


@dataclass(frozen=True)
class Member:
    """One worker's place in a round."""

    worker_id: str
    host: str
    slot: int
    address: str
    rank: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    def to_dict(self) -> dict:
        """Its fields (what ``dataclasses.asdict`` gives, without its deep copy: a plan
        of thousands of members is encoded at every round)."""
        return dict(vars(self))


@dataclass(frozen=True)
class Plan:
    """Round ``round_id``: its members in rank order. Rounds only grow. ``term``: the
    leader term of the driver that published it (0 in plans made outside a job); a
    worker refuses a plan of a term older than the newest it has seen
    (``plan_is_current``). ``snapshot``: what the members do with their state once the
    round formed, before they train: nothing (""), write a snapshot of it and train on
    (``SNAPSHOT_NOW``: a host is about to go), or write one and stop
    (``SNAPSHOT_FINAL``: the job is being stopped); ``snapshot_token``: that snapshot's
    name among attempts at the same commit (fresh for each such round). ``handover``:
    the round before it still works and only loses members that leave on purpose (a
    drained host): its members finish the step in flight and change rounds at their
    next commit, instead of abandoning that step at once (nothing is rolled back), and
    those left out end there (``elastic.runtime``)."""

    round_id: int
    members: tuple[Member, ...] = field(default_factory=tuple)
    term: int = 0
    snapshot: str = ""
    snapshot_token: str = ""
    handover: bool = False

    @property
    def size(self) -> int:
        return len(self.members)

    def member(self, worker_id: str) -> Member | None:
        for m in self.members:
            if m.worker_id == worker_id:
                return m
        return None

    @property
    def worker_ids(self) -> tuple[str, ...]:
        return tuple(m.worker_id for m in self.members)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "round_id": self.round_id,
                "members": [m.to_dict() for m in self.members],
                "term": self.term,
                **({"snapshot": self.snapshot} if self.snapshot else {}),
                **({"snapshot_token": self.snapshot_token} if self.snapshot_token else {}),
                **({"handover": True} if self.handover else {}),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Plan:
        raw = json.loads(data)
        return cls(
            round_id=int(raw["round_id"]),
            members=tuple(Member(**m) for m in raw["members"]),
            term=int(raw.get("term", 0)),
            snapshot=str(raw.get("snapshot", "")),
            snapshot_token=str(raw.get("snapshot_token", "")),
            handover=bool(raw.get("handover", False)),
        )


class RoundLike(Protocol):
    """What a worker reads of a round: the whole ``Plan``, or the view of it its host
    reads (``rendezvous.host_plan.RoundView``)."""

    @property
    def round_id(self) -> int: ...

    @property
    def term(self) -> int: ...

    @property
    def handover(self) -> bool: ...

    def member(self, worker_id: str) -> Member | None: ...


def handover_for(
    plan: RoundLike, latest: RoundLike | None, current: RoundLike | None, worker_id: str
) -> tuple[bool, bool]:
    """How worker ``worker_id`` takes the newer ``plan``, having formed the round
    ``current`` (None: none yet) and seen ``latest`` before it (pure): whether it defers
    the change to its next commit, and whether ``plan`` hands it over (it leaves).

    It defers when ``plan`` is a handover (``Plan.handover``) and so is every round
    published since its own: its ring still holds every member, so the step in flight
    ends there. A newcomer, with no ring yet, never defers. ``plan`` hands it over when
    it is a handover that leaves out a worker of ``current`` or of ``latest``."""
    defer = (
        plan.handover
        and current is not None
        and latest is not None
        and (latest.round_id == current.round_id or latest.handover)
    )
    was_in = any(p is not None and p.member(worker_id) is not None for p in (current, latest))
    return defer, plan.handover and was_in and plan.member(worker_id) is None


def plan_is_current(plan: RoundLike, latest: RoundLike | None, highest_term: int) -> bool:
    """Whether a worker takes ``plan``, having ``latest`` and the leader term
    ``highest_term`` seen so far (pure): a plan of an older term comes from a driver
    that has lost the lead (a paused old leader that woke up) and is refused; else only
    a newer round counts."""
    if plan.term < highest_term:
        return False
    return latest is None or plan.round_id > latest.round_id


@dataclass(frozen=True)
class ShardInfo:
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

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ShardInfo:
        raw = json.loads(data)
        known = {f: raw[f] for f in cls.__dataclass_fields__ if f in raw}
        return cls(**known)


@dataclass(frozen=True)
class CheckpointRecord:
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

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CheckpointRecord:
        raw = json.loads(data)
        known = {f: raw[f] for f in cls.__dataclass_fields__ if f in raw}
        return cls(**known)


class JsonRecord:
    """``to_json``/``from_json`` for a record dataclass whose readers take fields they do
    not know from a newer writer in their stride (unknown fields are ignored)."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()  # type: ignore[call-overload]

    @classmethod
    def from_json(cls: type[R], data: bytes) -> R:
        raw = json.loads(data)
        known = {f: raw[f] for f in cls.__dataclass_fields__ if f in raw}  # type: ignore[attr-defined]
        return cls(**known)


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


@dataclass(frozen=True)
class DriverRecord(JsonRecord):
    """The driver that leads a job, under ``JobKeys.driver`` and the driver's lease (so
    it vanishes when the driver is gone). ``driver_id`` is unique per driver process;
    ``started`` is a unix time; ``term`` numbers the job's successive leaders (1 for the
    driver that started the job): a plan or command from an older term than the
    leader's is stale."""

    driver_id: str
    host: str
    pid: int
    started: float
    term: int = 1


#: the longest rank 0 goes without rewriting its progress record (``progress_period``)
PROGRESS_PERIOD_MAX = 1.0


def progress_period(interval: float) -> float:
    """How often rank 0 writes its progress record under ``--progress-interval
    interval``: at most every second, and at least once per interval. The driver's
    progress line, said every interval, is then at most a second old, and a record that
    stops coming means rank 0 cannot be heard (the same step is written again while
    training stands still)."""
    return min(interval, PROGRESS_PERIOD_MAX)


@dataclass(frozen=True)
class WorldMaster(JsonRecord):
    """Where rank 0 of world ``world`` (``elastic-run --restart-workers``) serves torch's
    c10d store: ``address`` (its address toward the job's store) and ``port`` (free on
    its host when it was chosen), under ``JobKeys.world_master``; ``host`` is its host
    as the driver names it."""

    world: int
    address: str
    port: int
    host: str = ""


@dataclass(frozen=True)
class WorldSeat(JsonRecord):
    """A seat of world ``world`` given to a warm spare of restart mode, under
    ``JobKeys.world_seat``: ``variables``, what a worker started in that seat is told
    (its ranks and the world's sizes, as torchrun names them, and the job's own
    variables for meeting rank 0)."""

    world: int
    variables: dict[str, str]


@dataclass(frozen=True)
class ProgressRecord(JsonRecord):
    """Training progress under ``JobKeys.progress``: the number of commits (``step``) of
    rank 0 of round ``round_id`` (worker ``worker_id``), which holds the newest commit,
    made in round ``commit_round`` (every member of that round held the state then: a
    commit follows the round's sync and its step's collectives; 0 from older versions).
    Rewritten every ``progress_period``, changed or not."""

    step: int
    round_id: int
    worker_id: str = ""
    commit_round: int = 0


@dataclass(frozen=True)
class FailureRecord(JsonRecord):
    """A worker's report to the driver, under ``JobKeys.failure`` (written by worker
    ``worker_id`` under its lease): a collective of round ``round_id`` failed
    (``reason``), or (``silent``) member ``suspect`` has sent nothing for a moment
    (under ``JobKeys.silence``: not a failure yet). ``suspect``: the worker it blames,
    when it saw that peer stop answering itself (None: a crash needs no suspect, the
    driver sees the process exit).

    Raises (when made):
        TypeError: a field of the wrong type, or one missing (a report is taken whole
            or not at all).
    Raises (``from_json``, besides those):
        ValueError: the bytes are not JSON (or not UTF-8).
    """

    worker_id: str
    round_id: int
    reason: str
    suspect: str | None = None
    silent: bool = False

    MAX_REASON = 500  # characters of ``reason`` kept (a report is a hint, not a log)

    def __post_init__(self):
        checks = (
            ("worker_id", isinstance(self.worker_id, str)),
            ("round_id", isinstance(self.round_id, int) and not isinstance(self.round_id, bool)),
            ("reason", isinstance(self.reason, str)),
            ("suspect", self.suspect is None or isinstance(self.suspect, str)),
            ("silent", isinstance(self.silent, bool)),
        )
        bad = [name for name, ok in checks if not ok]
        if bad:
            raise TypeError(f"failure report: bad {', '.join(bad)}")
        if len(self.reason) > self.MAX_REASON:
            object.__setattr__(self, "reason", self.reason[: self.MAX_REASON])


@dataclass(frozen=True)
class FinishRecord(JsonRecord):
    """Under ``JobKeys.finished(worker)`` and ``JobKeys.training_finished``: a worker's
    training function returned in round ``round`` after ``commits`` commits (the
    driver's word that training is done, and the step it ended at); ``worker``: whose
    (empty in records of older versions)."""

    round: int
    commits: int
    worker: str = ""


@dataclass(frozen=True)
class SnapshotAt(JsonRecord):
    """Under ``JobKeys.snapshot_at``: every member of round ``round_id`` writes its part of
    the state it committed at commit ``step`` (written by rank 0); ``token`` names this
    attempt (its folder), apart from a torn one of an earlier run at the same step."""

    round_id: int
    step: int
    token: str = ""


@dataclass(frozen=True)
class SnapshotPart(JsonRecord):
    """Under ``JobKeys.snapshot_part``: part ``part`` of the snapshot of commit ``step`` is
    durable (``bytes``, ``sha256`` of the file; ``leaves``: a digest of the sizes of the
    state's arrays as its writer cut them, which every part must share); ``error``
    instead when its writer could not write it (a full disk) or missed the commit: the
    snapshot is then abandoned."""

    part: int
    sha256: str = ""
    bytes: int = 0
    error: str = ""
    leaves: str = ""


@dataclass(frozen=True)
class SnapshotRecord(JsonRecord):
    """What a snapshot says to the driver, under ``JobKeys.snapshots``: the snapshot of
    commit ``step`` (taken in round ``round_id``) by ``group`` is complete in ``path``
    (``done``), could not be written (``failed``: ``error`` says why), or round
    ``round_id`` resumed from it (``loaded``). ``host``: the label of a host whose disk
    holds it ("" when every member of several hosts sees ``path``); ``final``: the snapshot a stop
    asked for; ``seconds``: from the commit to the manifest; ``bytes``: its size."""

    step: int
    round_id: int
    path: str
    host: str = ""
    final: bool = False
    seconds: float = 0.0
    bytes: int = 0
    error: str = ""


@dataclass(frozen=True)
class BlacklistEntry(JsonRecord):
    """A blacklisted host in ``DriverStateRecord``: its strikes so far and the unix time
    its cooldown ends (wall clock: a successor on another host has its own monotonic
    clock)."""

    host: str
    strikes: int
    until: float


@dataclass(frozen=True)
class DriverStateRecord(JsonRecord):
    """What the leader of ``term`` knows that the store does not otherwise say, under
    ``JobKeys.driver_state`` (written by the leader when it changes, fenced): what a
    successor needs to go on as if nothing happened.

    ``resets``/``failure_streak``: the round rules' counters; ``blacklist``: hosts in
    their cooldown, with strikes (``BlacklistEntry`` as lists ``[host, strikes, until]``);
    ``strikes``: every host's strikes (``[host, n]``), cooldowns ended included;
    ``done_slots``: ``[host, slot]`` whose worker finished; ``training_done``: a member's
    training function returned; ``launched``: the worker-id sequence (ids are never
    reused); ``given_up``: ``[worker_id, state]`` of workers the leader was stopping or
    killing (a successor must not take them back); ``secret_id``: a fingerprint of the
    job secret (never the secret), so a successor launching with another is refused;
    ``written``: unix time."""

    term: int
    resets: int = 0
    failure_streak: int = 0
    blacklist: list = field(default_factory=list)
    strikes: list = field(default_factory=list)
    done_slots: list = field(default_factory=list)
    training_done: bool = False
    launched: int = 0
    given_up: list = field(default_factory=list)
    secret_id: str = ""
    written: float = 0.0
