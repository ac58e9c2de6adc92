"""The driver's event vocabulary: every event it records, as a typed value.

Every event is a frozen dataclass: its ``kind`` (a class constant) names it in the
events file, its fields are exactly what the file holds (``driver.events.log`` writes
``{"t", "elapsed", "kind", **fields}``), and ``str(event)`` is the readable line.
Code that emits an event constructs one of these classes, so what is written cannot
drift from what is documented: the class *is* the documentation. ``quiet`` events
(worker started, checkpoint written, ...) reach stderr only with ``--verbose``.
``vocabulary()`` maps every kind to its class (readers such as ``runplot`` use it).

Times in fields are seconds; ``code`` is an exit code (-N: killed by signal N); a
``rank`` is None for a worker outside the current round. A ``step`` field counts one of
two things: rank 0's commits (``progress``, ``job_done``, the snapshots, ``state_lost``,
``job_stopped``), or, in the ``ps`` events, the shards' global step; ``runplot`` draws
them apart.

The vocabulary by area, one module each:

* ``base``: ``Event`` and its registry (``vocabulary``, ``is_known``), ``EventSink``,
  and the text helpers (``describe_code``);
* ``job``: the job's start, its rounds, a long wait, its end;
* ``health``: training progress and the store's reachability;
* ``workers``: one worker started, exited, failed, stopped, reported, hung, chaos-killed; a
  spare ready, promoted or lost;
* ``hosts``: hosts added, removed, resized, blacklisted, back, cut off; discovery errors;
* ``ps``: the parameter-server shards and their checkpoints;
* ``snapshots``: the workers' snapshots: written, not usable, resumed from.

This file names every event class, so emitters and readers import one vocabulary
(``from driver import events as ev``; ``ev.RoundFormed``).
"""

from driver.events.base import (
    RESERVED_FIELDS,
    Event,
    EventSink,
    describe_code,
    is_known,
    vocabulary,
)
from driver.events.health import Progress, StoreBack, StoreUnreachable
from driver.events.hosts import (
    HostAdded,
    HostBlacklisted,
    HostBlacklistSkipped,
    HostDiscoveryFailed,
    HostEvent,
    HostPreempted,
    HostRemoved,
    HostReturned,
    HostSlotsChanged,
    HostUnreachable,
)
from driver.events.job import (
    JobDone,
    JobFailure,
    JobStarted,
    JobStop,
    LeadershipLostEvent,
    Leading,
    RoundFormed,
    StandingBy,
    StateLost,
    Stopping,
    TrainingFinished,
    Waiting,
    WorldStarted,
    WorldStopping,
)
from driver.events.ps import (
    CheckpointFailed,
    CheckpointWritten,
    PsBackupExited,
    PsBackupReady,
    PsExited,
    PsFailedOver,
    PsRestarted,
    PsRolledBack,
    PsStarted,
)
from driver.events.snapshots import SnapshotFailed, SnapshotResumed, SnapshotWritten
from driver.events.workers import (
    ChaosKill,
    FailureReported,
    SpareLost,
    SparePromoted,
    SpareReady,
    WorkerAdopted,
    WorkerExited,
    WorkerFailed,
    WorkerHung,
    WorkerStarted,
    WorkerStopped,
    WorkerStopping,
)

KINDS = frozenset(vocabulary())
"""Every event kind of the vocabulary."""

__all__ = [
    # base
    "Event",
    "EventSink",
    "vocabulary",
    "is_known",
    "describe_code",
    "RESERVED_FIELDS",
    "KINDS",
    # job
    "JobStarted",
    "Leading",
    "LeadershipLostEvent",
    "RoundFormed",
    "StandingBy",
    "StateLost",
    "Waiting",
    "WorldStarted",
    "WorldStopping",
    "JobDone",
    "TrainingFinished",
    "JobFailure",
    "Stopping",
    "JobStop",
    # health
    "Progress",
    "StoreUnreachable",
    "StoreBack",
    # workers
    "WorkerStarted",
    "WorkerAdopted",
    "WorkerExited",
    "WorkerFailed",
    "WorkerStopping",
    "SpareReady",
    "SparePromoted",
    "SpareLost",
    "WorkerStopped",
    "FailureReported",
    "WorkerHung",
    "ChaosKill",
    # hosts
    "HostEvent",
    "HostAdded",
    "HostRemoved",
    "HostSlotsChanged",
    "HostBlacklisted",
    "HostUnreachable",
    "HostPreempted",
    "HostBlacklistSkipped",
    "HostReturned",
    "HostDiscoveryFailed",
    # ps
    "PsStarted",
    "PsExited",
    "PsBackupExited",
    "PsBackupReady",
    "PsFailedOver",
    "PsRestarted",
    "PsRolledBack",
    "CheckpointWritten",
    "CheckpointFailed",
    # snapshots
    "SnapshotWritten",
    "SnapshotFailed",
    "SnapshotResumed",
]
