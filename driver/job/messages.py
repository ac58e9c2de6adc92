"""What the job's threads tell its main loop: one small frozen class per kind of news.

Only the main loop (``driver.job.loop.Job``) owns the job's state; every other thread (process
waiters, store watches, discovery, signal handlers, the chaos timer, the ps supervisor)
posts one of these to its queue, and the loop dispatches on the class.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from driver.hosts.slots import HostSlots
from rendezvous.keys import JobKeys
from rendezvous.schema.rounds import Plan
from rendezvous.schema.snapshots import SnapshotRecord
from rendezvous.schema.workers import FailureRecord
from rendezvous.store import PUT, Event, KeyValue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessExited:
    """The process of worker ``worker_id`` exited with ``code``."""

    worker_id: str
    code: int


@dataclass(frozen=True)
class RegistryChanged:
    """A worker registration was written or vanished (a store watch event)."""

    event: Event


@dataclass(frozen=True)
class RegistrationRead:
    """A registration read again after its lease lapsed while the store was in trouble
    (``driver.policy.lapses``): ``kv`` None when it is gone, or (``readable`` False)
    when the store could not be read."""

    worker_id: str
    kv: KeyValue | None
    readable: bool = True


@dataclass(frozen=True)
class RegistryResync:
    """Every registration, read afresh after the registry watch ended."""

    kvs: Sequence[KeyValue]


@dataclass(frozen=True)
class FailureReport:
    """A worker reported a failure it saw, a silent peer, or its own hung training (a
    store watch event, read on the watch's thread): its ``record``, None when the
    report was deleted or could not be read (``from_event``)."""

    record: FailureRecord | None

    @classmethod
    def from_event(cls, event: Event) -> FailureReport:
        """The report a store event carries (None for a deletion; an unreadable report
        is logged and read as None: one bad writer must not stop the loop)."""
        return cls.from_kv(event.kv) if event.type == PUT else cls(None)

    @classmethod
    def from_kv(cls, kv: KeyValue) -> FailureReport:
        """The report stored in ``kv`` (an unreadable one is logged and read as None)."""
        try:
            return cls(FailureRecord.from_json(kv.value))
        except (ValueError, TypeError, RecursionError) as exc:  # (JSON nested too deep)
            log.warning("ignoring an unreadable failure report %s: %s", kv.key, exc)
            return cls(None)


@dataclass(frozen=True)
class ProbeAnswered:
    """The reachability probe of ``host`` came back."""

    host: str
    reachable: bool
    detail: str


@dataclass(frozen=True)
class FailureResync:
    """Every failure report, read afresh when that watch starts (a driver that just took
    the lead reads those written while the job had no leader) or after it ended."""

    kvs: Sequence[KeyValue]


@dataclass(frozen=True)
class AgentLost:
    """The agent of ``host`` stopped answering (its record's lease lapsed)."""

    host: str
    detail: str


@dataclass(frozen=True)
class AgentReady:
    """The agent of ``host`` registered: processes can be started there."""

    host: str


@dataclass(frozen=True)
class HostsFound:
    """A discovery run listed ``hosts``."""

    hosts: tuple[HostSlots, ...]


@dataclass(frozen=True)
class DiscoveryFailed:
    """A discovery run failed (after the first; the first is fatal)."""

    error: str


@dataclass(frozen=True)
class SignalReceived:
    """``elastic-run`` got SIGINT or SIGTERM."""

    signum: int


@dataclass(frozen=True)
class StacksAsked:
    """``elastic-run`` got SIGUSR1: print every live worker's stacks, changing nothing."""


@dataclass(frozen=True)
class StoreLost:
    """The store stayed unreachable longer than the job may wait."""

    reason: str


@dataclass(frozen=True)
class ProgressReported:
    """Rank 0 published its commit count: the record's JSON (a store watch event)."""

    value: bytes


@dataclass(frozen=True)
class SnapshotReported:
    """What a worker's snapshot said (``JobKeys.snapshots``): ``kind`` "done" (the newest
    complete one of a group), "failed" or "loaded" (a round resumed from it), and its
    ``record``; None when it could not be read (logged)."""

    kind: str
    record: SnapshotRecord | None

    @classmethod
    def from_kv(cls, keys: JobKeys, kv: KeyValue) -> SnapshotReported:
        kind = kv.key[len(keys.snapshots) :].split("/", 1)[0]
        try:
            return cls(kind, SnapshotRecord.from_json(kv.value))
        except (ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable snapshot record %s: %s", kv.key, exc)
            return cls(kind, None)


@dataclass(frozen=True)
class TrainingFinished:
    """A worker recorded that its training function returned (``JobKeys.training_finished``,
    a ``FinishRecord`` as written): the training is complete."""

    record: bytes


@dataclass(frozen=True)
class HostPreempted:
    """The agent of ``host`` got SIGTERM (``JobKeys.preempted``): the scheduler takes the
    host back."""

    host: str


@dataclass(frozen=True)
class KillRequested:
    """Kill worker ``worker_id`` (it is known to be hung)."""

    worker_id: str
    reason: str


@dataclass(frozen=True)
class ChaosTick:
    """The chaos timer fired: kill a member of the round."""


@dataclass(frozen=True)
class Fatal:
    """A component cannot go on (e.g. a ps shard keeps dying); ``reason`` ends the job."""

    reason: str


@dataclass(frozen=True)
class LeadLost:
    """Another driver took the job over: ``reason`` names it (this one must stop
    steering at once)."""

    reason: str


Message = Union[
    ProcessExited,
    RegistryChanged,
    RegistrationRead,
    RegistryResync,
    FailureReport,
    FailureResync,
    ProbeAnswered,
    AgentLost,
    AgentReady,
    HostsFound,
    DiscoveryFailed,
    SignalReceived,
    StacksAsked,
    StoreLost,
    ProgressReported,
    TrainingFinished,
    SnapshotReported,
    HostPreempted,
    KillRequested,
    ChaosTick,
    Fatal,
    LeadLost,
]


def read_through_accusations(message: Message) -> bool:
    """A failure report (not a silence report): the rules read it only through the
    accusations it makes or clears (``policy.failure_reported``), so it asks for a turn
    of the rules only when those changed."""
    return isinstance(message, FailureReport) and (
        message.record is not None and not message.record.silent and not message.record.hung
    )


def changes_nothing(message: Message, plan: Plan | None, progress_said: bool = False) -> bool:
    """A failure report's deletion (or an unreadable one), or a failure report about a
    round other than the current one: the rules read nothing from it
    (``policy.failure_reported``), so it asks for no turn of the rules. Every survivor
    of a round of thousands reports the round's failure, mostly after the next round is
    out: a turn of the rules for each report would read every worker once per worker.
    Likewise rank 0's progress record once a first progress line is said
    (``progress_said``): it comes every second, the progress rule wakes itself for its
    next line, and the round rules read the step only when the membership changes."""
    if isinstance(message, ProgressReported):
        return progress_said
    if not isinstance(message, FailureReport):
        return False
    record = message.record
    if record is None:
        return True
    if record.hung:
        return False  # a kill, whatever its round (``policy.hangs``)
    return not record.silent and (plan is None or record.round_id != plan.round_id)
