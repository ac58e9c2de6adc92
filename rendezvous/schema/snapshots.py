"""The records of the workers' snapshots (``elastic.snapshots``): the commit every
member writes (``SnapshotAt``), each part made durable (``SnapshotPart``), and what a
snapshot says to the driver (``SnapshotRecord``)."""

from __future__ import annotations

from dataclasses import dataclass

from rendezvous.schema.record import JsonRecord


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
