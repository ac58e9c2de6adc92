"""The driver's event vocabulary: every event it records, as a typed value.

Every event is a frozen dataclass below: its ``kind`` (a class constant) names it in
the events file, its fields are exactly what the file holds (``driver.eventlog`` writes
``{"t", "elapsed", "kind", **fields}``), and ``str(event)`` is the readable line.
Code that emits an event constructs one of these classes, so what is written cannot
drift from what is documented here: the class *is* the documentation. ``quiet``
events (worker started, checkpoint written, ...) reach stderr only with ``--verbose``.
``vocabulary()`` maps every kind to its class (readers such as ``runplot`` use it).

Times in fields are seconds; ``code`` is an exit code (-N: killed by signal N); a
``rank`` is None for a worker outside the current round. Readers may also find a
``step`` field (the newest committed training step) on any event; ``runplot`` draws it.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from driver.errors import EventError

RESERVED_FIELDS = frozenset({"t", "elapsed", "kind"})
_VOCABULARY: dict[str, type[Event]] = {}


# ----------------------------------------------------------------------------- text helpers


def describe_code(code: Any) -> str:
    """``exit 3``, ``killed by SIGKILL`` (for -9), or the value as it is."""
    if isinstance(code, bool) or not isinstance(code, int):
        return f"code {code}"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def _seconds(value: Any) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.2f}s" if value < 10 else f"{value:.0f}s"
    return str(value)


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _worker(host: str, slot: int, rank: int | None = None) -> str:
    return f"worker [{rank}] {host}:{slot}" if rank is not None else f"worker {host}:{slot}"


# ----------------------------------------------------------------------------- the base


@dataclass(frozen=True)
class Event:
    """Base of every event. A subclass sets ``kind`` (registered in the vocabulary when
    the class is made), may set ``quiet``, and defines ``__str__``.

    Raises:
        EventError: (when a subclass is defined) a field named ``t``, ``elapsed`` or
            ``kind``, or a kind another class already has.
    """

    kind: ClassVar[str] = ""
    quiet: ClassVar[bool] = False  # stderr only with --verbose (always in the file)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The class's own annotations (or, without any, its base's: checked already).
        own = getattr(cls, "__annotations__", {})
        reserved = sorted(
            RESERVED_FIELDS.intersection(
                name for name, hint in own.items() if "ClassVar" not in str(hint)
            )
        )
        if reserved:
            raise EventError(f"reserved event field(s) {reserved} in {cls.__name__}")
        kind = cls.__dict__.get("kind")
        if kind:
            if _VOCABULARY.get(kind, cls) is not cls:
                raise EventError(f"event kind {kind!r} defined twice")
            _VOCABULARY[kind] = cls


def vocabulary() -> Mapping[str, type[Event]]:
    """Every event kind and its class."""
    return dict(_VOCABULARY)


def is_known(event: object) -> bool:
    """True if ``event`` is an instance of a class of the vocabulary."""
    return isinstance(event, Event) and _VOCABULARY.get(event.kind) is type(event)


class EventSink(Protocol):
    """Where components send their events (an ``EventLog``, or a list in a test)."""

    def emit(self, event: Event) -> object: ...


# ----------------------------------------------------------------------------- the job


@dataclass(frozen=True)
class JobStarted(Event):
    kind: ClassVar[str] = "job_started"
    quiet: ClassVar[bool] = True
    job_id: str
    store: str  # the store URL workers use
    np: int
    min_np: int
    max_np: int | None
    command: Sequence[str]

    def __str__(self) -> str:
        return f"job {self.job_id} started on store {self.store}"


@dataclass(frozen=True)
class RoundFormed(Event):
    """Round ``round`` was published; ``seconds`` from the first membership change it
    answers to its publication; ``members`` are worker ids in rank order."""

    kind: ClassVar[str] = "round_formed"
    round: int
    size: int
    seconds: float
    members: Sequence[str]

    def __str__(self) -> str:
        return (
            f"round {self.round} formed: {_plural(self.size, 'worker')} in {_seconds(self.seconds)}"
        )


@dataclass(frozen=True)
class Waiting(Event):
    """A long wait, and what for (``waited``: seconds so far)."""

    kind: ClassVar[str] = "waiting"
    what: str
    waited: float

    def __str__(self) -> str:
        return f"waiting for {self.what} ({_seconds(self.waited)} so far)"


@dataclass(frozen=True)
class JobDone(Event):
    """Every member of the final round ``round`` (of ``size``) exited 0."""

    kind: ClassVar[str] = "job_done"
    round: int
    size: int
    resets: int  # rounds that followed the first, not counting finishing ones

    def __str__(self) -> str:
        return (
            f"job done in round {self.round} ({_plural(self.size, 'worker')}, "
            f"{_plural(self.resets, 'reset')})"
        )


@dataclass(frozen=True)
class JobFailure(Event):
    """The job failed (``elastic-run`` prints the reason itself, so it is quiet here)."""

    kind: ClassVar[str] = "job_failed"
    quiet: ClassVar[bool] = True
    reason: str
    rounds: int  # the last round formed (0: none)
    seconds: float  # since the job started

    def __str__(self) -> str:
        return f"job failed: {self.reason}"


@dataclass(frozen=True)
class Progress(Event):
    """Training progress, every ``--progress-interval``: round ``round`` of ``size``
    workers, ``step`` commits held by its rank 0, and the commits per second since the
    last such event (None for the first)."""

    kind: ClassVar[str] = "progress"
    round: int
    size: int
    step: int
    steps_per_second: float | None

    def __str__(self) -> str:
        rate = self.steps_per_second
        per_second = ""
        if isinstance(rate, (int, float)):
            per_second = f" ({rate:.1f} steps/s)"
        elif rate is not None:
            per_second = f" ({rate} steps/s)"
        where = f"round {self.round}, {_plural(self.size, 'worker')}"
        return f"progress: {where}, step {self.step}{per_second}"


# ----------------------------------------------------------------------------- the store


@dataclass(frozen=True)
class StoreUnreachable(Event):
    """The rendezvous store does not answer the driver (said at once, then every few
    seconds while it lasts); ``seconds``: how long so far, ``error``: the last error."""

    kind: ClassVar[str] = "store_unreachable"
    seconds: float
    error: str

    def __str__(self) -> str:
        return (
            f"the rendezvous store is unreachable ({_seconds(self.seconds)} so far): {self.error}"
        )


@dataclass(frozen=True)
class StoreBack(Event):
    """The rendezvous store answers again, after ``seconds`` unreachable."""

    kind: ClassVar[str] = "store_back"
    seconds: float

    def __str__(self) -> str:
        return f"the rendezvous store is back after {_seconds(self.seconds)}"


# ----------------------------------------------------------------------------- workers


@dataclass(frozen=True)
class WorkerStarted(Event):
    kind: ClassVar[str] = "worker_started"
    quiet: ClassVar[bool] = True
    worker: str
    host: str
    slot: int
    pid: int

    def __str__(self) -> str:
        return f"{_worker(self.host, self.slot)} started (pid {self.pid})"


@dataclass(frozen=True)
class WorkerExited(Event):
    """The worker finished on its own with code 0."""

    kind: ClassVar[str] = "worker_exited"
    quiet: ClassVar[bool] = True
    worker: str
    host: str
    slot: int
    code: int
    rank: int | None

    def __str__(self) -> str:
        return f"{_worker(self.host, self.slot, self.rank)} exited ({describe_code(self.code)})"


@dataclass(frozen=True)
class WorkerFailed(Event):
    """The worker exited with an error or a signal nobody in the driver sent it (or was
    killed by the driver or the chaos), or could not be started (``code`` None and a
    ``reason``). ``in_round``: it was a member of the current round."""

    kind: ClassVar[str] = "worker_failed"
    worker: str
    host: str
    slot: int
    code: int | None
    rank: int | None = None
    in_round: bool = False
    chaos: bool = False  # killed by --chaos-kill-interval: not its host's fault
    reason: str | None = None

    def __str__(self) -> str:
        text = f"{_worker(self.host, self.slot, self.rank)} failed"
        if self.code is not None:
            text += f" ({describe_code(self.code)})"
        if self.chaos:
            text += " (chaos kill)"
        return text + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class WorkerStopping(Event):
    """The driver sent SIGTERM (SIGKILL follows after the grace)."""

    kind: ClassVar[str] = "worker_stopping"
    quiet: ClassVar[bool] = True
    worker: str
    host: str
    slot: int
    reason: str

    def __str__(self) -> str:
        return f"stopping {_worker(self.host, self.slot)}: {self.reason}"


@dataclass(frozen=True)
class WorkerStopped(Event):
    """A worker the driver stopped has exited."""

    kind: ClassVar[str] = "worker_stopped"
    quiet: ClassVar[bool] = True
    worker: str
    host: str
    slot: int
    code: int

    def __str__(self) -> str:
        return f"{_worker(self.host, self.slot)} stopped ({describe_code(self.code)})"


@dataclass(frozen=True)
class FailureReported(Event):
    """Worker ``reporter`` saw a peer fail in ``round`` (``suspect``: the peer it names)."""

    kind: ClassVar[str] = "failure_reported"
    quiet: ClassVar[bool] = True
    reporter: str | None
    round: int | None
    reason: str | None
    suspect: str | None

    def __str__(self) -> str:
        text = f"worker {self.reporter} reports a failure in round {self.round}"
        if self.suspect:
            text += f", blaming {self.suspect}"
        return text + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class ChaosKill(Event):
    """``--chaos-kill-interval`` SIGKILLed a member of the round (``kill``: how many so far)."""

    kind: ClassVar[str] = "chaos_kill"
    worker: str
    host: str
    slot: int
    rank: int | None
    pid: int
    kill: int

    def __str__(self) -> str:
        return (
            f"chaos: killed {_worker(self.host, self.slot, self.rank)} (pid {self.pid}), "
            f"kill {self.kill}"
        )


# ----------------------------------------------------------------------------- hosts


@dataclass(frozen=True)
class HostEvent(Event):
    """Something that changed about a host (``driver.hosts.HostManager`` makes these)."""

    host: str


@dataclass(frozen=True)
class HostAdded(HostEvent):
    kind: ClassVar[str] = "host_added"
    slots: int

    def __str__(self) -> str:
        return f"host {self.host} added with {self.slots} slot(s)"


@dataclass(frozen=True)
class HostRemoved(HostEvent):
    kind: ClassVar[str] = "host_removed"
    slots: int

    def __str__(self) -> str:
        return f"host {self.host} removed (had {self.slots} slot(s))"


@dataclass(frozen=True)
class HostSlotsChanged(HostEvent):
    kind: ClassVar[str] = "host_slots_changed"
    old_slots: int
    new_slots: int

    def __str__(self) -> str:
        return f"host {self.host} now has {self.new_slots} slot(s) (was {self.old_slots})"


@dataclass(frozen=True)
class HostBlacklisted(HostEvent):
    """``failures`` worker failures within the window; out until ``until`` (on the
    driver's monotonic clock) for ``cooldown`` seconds, its ``strikes``-th time."""

    kind: ClassVar[str] = "host_blacklisted"
    failures: int
    strikes: int
    cooldown: float
    until: float

    def __str__(self) -> str:
        return (
            f"host {self.host} blacklisted for {self.cooldown:g} s after {self.failures} "
            f"worker failure(s) (strike {self.strikes})"
        )


@dataclass(frozen=True)
class HostUnreachable(HostEvent):
    """Peers stopped hearing from a worker on ``host`` and the host did not answer a
    connection attempt either (``detail``): it is cut off or down, with all its workers."""

    kind: ClassVar[str] = "host_unreachable"
    detail: str
    workers: list[str]

    def __str__(self) -> str:
        return (
            f"host {self.host} is unreachable ({self.detail}): dropping its workers "
            f"{', '.join(self.workers) or '(none)'}"
        )


@dataclass(frozen=True)
class HostBlacklistSkipped(HostEvent):
    """The host met the blacklisting rule but is kept: without it fewer than ``min_np``
    slots would remain (``remaining_slots``)."""

    kind: ClassVar[str] = "host_blacklist_skipped"
    failures: int
    remaining_slots: int
    min_np: int

    def __str__(self) -> str:
        return (
            f"host {self.host} kept despite {self.failures} worker failure(s): without it "
            f"{self.remaining_slots} slot(s) would remain, fewer than min_np {self.min_np}"
        )


@dataclass(frozen=True)
class HostReturned(HostEvent):
    """The host's cooldown ended; it is usable again (if discovery still lists it)."""

    kind: ClassVar[str] = "host_back"

    def __str__(self) -> str:
        return f"host {self.host} back from the blacklist"


@dataclass(frozen=True)
class HostDiscoveryFailed(Event):
    """A discovery run after the first failed (it is retried at the next interval)."""

    kind: ClassVar[str] = "discovery_error"
    error: str

    def __str__(self) -> str:
        return f"host discovery failed: {self.error}"


# ----------------------------------------------------------------------------- ps shards


@dataclass(frozen=True)
class PsStarted(Event):
    """Shard ``shard`` (process ``pid``) serves at ``address``."""

    kind: ClassVar[str] = "ps_started"
    quiet: ClassVar[bool] = True
    shard: int
    address: str
    pid: int

    def __str__(self) -> str:
        return f"ps shard {self.shard} started on {self.address} (pid {self.pid})"


@dataclass(frozen=True)
class PsExited(Event):
    kind: ClassVar[str] = "ps_exited"
    shard: int
    code: int | None

    def __str__(self) -> str:
        return f"ps shard {self.shard} exited ({describe_code(self.code)})"


@dataclass(frozen=True)
class PsRestarted(Event):
    kind: ClassVar[str] = "ps_restarted"
    shard: int

    def __str__(self) -> str:
        return f"ps shard {self.shard} restarted"


@dataclass(frozen=True)
class CheckpointWritten(Event):
    """Coordinated checkpoint ``checkpoint`` of training step ``step`` is complete in
    ``path``; ``seconds``: training paused plus files written. ``final``: the shards
    stop with the job and this checkpoint holds their last state (it may repeat a
    checkpoint reported before, when nothing changed since)."""

    kind: ClassVar[str] = "checkpoint_written"
    quiet: ClassVar[bool] = True
    step: int
    path: str
    seconds: float
    checkpoint: int
    final: bool = False

    def __str__(self) -> str:
        return (
            f"{'final ' if self.final else ''}checkpoint {self.checkpoint} of step "
            f"{self.step} written in {_seconds(self.seconds)} to {self.path}"
        )


KINDS = frozenset(_VOCABULARY)
"""Every event kind of the vocabulary."""
