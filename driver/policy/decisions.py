"""What the job's rules decide, and what they remember: plain values, no behaviour.

``driver.policy`` returns these; ``driver.job.loop`` carries them out, one handler per class.
A ``Step`` pairs decisions with the ``Book`` after them (the loop's memory between
decisions, one record per concern: ``driver.policy.memory``; replaced, never changed); a ``HostsView`` is what the rules ask of the host
manager, as of one moment.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple, Union

from driver.events import Event
from driver.hosts.manager import HostManager
from driver.hosts.slots import HostSlots
from driver.policy.memory.failures import FailureBook
from driver.policy.memory.hosts import HostBook
from driver.policy.memory.progress import ProgressBook
from driver.policy.memory.rounds import RoundBook
from driver.policy.memory.spares import SpareBook
from driver.policy.memory.worlds import WorldBook
from driver.policy.planner import World
from rendezvous.schema.rounds import Plan


@dataclass(frozen=True)
class Publish:
    """Publish ``plan`` as the next round; ``seconds`` since the change it answers."""

    plan: Plan
    seconds: float


@dataclass(frozen=True)
class Wait:
    """Nothing to do about ``why`` before ``until`` (unless a message comes first)."""

    until: float
    why: str


@dataclass(frozen=True)
class Fail:
    """End the job; ``reason`` is the one line ``elastic-run`` prints."""

    reason: str


@dataclass(frozen=True)
class Kill:
    """SIGKILL the worker (it is hung or unresponsive); its exit counts as a failure,
    unless the ``chaos`` killed it (then it is not its host's fault)."""

    worker_id: str
    reason: str
    chaos: bool = False


@dataclass(frozen=True)
class Stop:
    """Stop the worker (SIGTERM, SIGKILL after the grace); its exit is no failure."""

    worker_id: str
    reason: str


@dataclass(frozen=True)
class Leave:
    """The worker leaves at its next commit, on its own (a handover round leaves it out:
    ``Plan.handover``): no signal now; its exit is no failure, like a stop's."""

    worker_id: str
    reason: str
    until: float


@dataclass(frozen=True)
class Launch:
    """Start a worker in slot ``slot`` of ``host``."""

    host: str
    slot: int


@dataclass(frozen=True)
class LaunchSpare:
    """Start a spare worker on ``host`` (``index``: its place among the host's spares):
    it loads the script up to ``elastic.init()``, registers and waits, in no round."""

    host: str
    index: int


@dataclass(frozen=True)
class Promote:
    """The registered spare ``worker_id`` takes slot ``slot`` of ``host`` (its own host):
    from now on it is a worker like any other, a candidate for the next round."""

    worker_id: str
    host: str
    slot: int


@dataclass(frozen=True)
class Report:
    """Emit ``event``."""

    event: Event


@dataclass(frozen=True)
class CountFailure:
    """A worker on ``host`` failed on its own (exit ``code``; or could not start, then
    ``reason`` says why): count it against the host (blacklisting) and then, unless
    ``streak`` is False (a spare: it held no work), against the failure streak
    (``count_failure``)."""

    host: str
    code: int | None
    reason: str | None = None
    streak: bool = True


@dataclass(frozen=True)
class Succeed:
    """The job is done: every member of round ``round`` (of ``size``) exited 0, with
    ``step`` commits (None: the workers commit no state, or did not say)."""

    round: int
    size: int
    resets: int
    step: int | None = None


@dataclass(frozen=True)
class Probe:
    """Ask whether ``host`` still answers, at ``address`` (a silent worker's listener)."""

    host: str
    address: str


@dataclass(frozen=True)
class HostLost:
    """``host`` is unreachable: take it out of the job for its cooldown."""

    host: str
    detail: str


@dataclass(frozen=True)
class SnapshotNow:
    """Publish the current round again, as ``plan``, asking its members to write a
    snapshot of their newest commit before they train on (a host is about to go)."""

    plan: Plan


@dataclass(frozen=True)
class RetireAgent:
    """Ask the agent of ``host`` to exit: discovery removed the host and nothing the
    job assigned there still runs."""

    host: str


@dataclass(frozen=True)
class StartWorld:
    """Start every worker of ``world`` (restart mode: ``driver.policy.restarts``), each
    told its ranks and the world's (``driver.job.wiring.torchrun_env``); ``seconds``
    since the change it answers (0 for the first)."""

    world: World
    seconds: float


@dataclass(frozen=True)
class PrepareHost:
    """Make ``host`` ready to take processes (restart mode: start its agent ahead of
    the world that would grow onto it; ``AgentService.prepare``)."""

    host: str


Decision = Union[
    Publish,
    Wait,
    Fail,
    Kill,
    Stop,
    Leave,
    Launch,
    LaunchSpare,
    Promote,
    Report,
    CountFailure,
    Succeed,
    Probe,
    HostLost,
    SnapshotNow,
    RetireAgent,
    StartWorld,
    PrepareHost,
]


@dataclass(frozen=True)
class Book:
    """What the loop remembers between decisions, one record per concern
    (``driver.policy.memory``); replaced, never changed. A rule replaces the records of
    its own concern and reads the others'. The few changes the loop itself asks for
    (the membership changed, a round was published, ...) are methods here."""

    rounds: RoundBook
    failures: FailureBook = field(default_factory=FailureBook)
    progress: ProgressBook = field(default_factory=ProgressBook)
    spares: SpareBook = field(default_factory=SpareBook)
    hosts: HostBook = field(default_factory=HostBook)
    world: WorldBook = field(default_factory=WorldBook)

    @classmethod
    def start(cls, now: float) -> Book:
        """The book of a job that starts at ``now``."""
        return cls(RoundBook(started_at=now))

    @property
    def training_done(self) -> bool:
        """The training is complete (``RoundBook.training_done_at``)."""
        return self.rounds.training_done

    def training_finished(self, now: float) -> Book:
        """The driver learned at ``now`` that the training is complete."""
        return replace(self, rounds=self.rounds.training_finished(now))

    def changed(self, now: float) -> Book:
        """The membership changed at ``now``."""
        return replace(self, rounds=self.rounds.changed(now))

    def new_round(self, round_id: int = 0, handover: bool = False) -> Book:
        """Round ``round_id`` was published: the reports of the one before are settled
        (unless it is a ``handover``: ``FailureBook.new_round``)."""
        return replace(self, failures=self.failures.new_round(round_id, handover))

    def leaves(self, worker_id: str, until: float) -> Book:
        """``worker_id`` leaves at its next commit, stopped if still running at ``until``."""
        return replace(self, hosts=self.hosts.leaves(worker_id, until))

    def snapshot_complete(self, host: str, step: int, round_id: int = 0) -> Book:
        """A snapshot of ``step``, taken in round ``round_id``, is complete on ``host``'s
        disk ("": every worker's)."""
        return replace(self, progress=self.progress.snapshot_complete(host, step, round_id))


@dataclass(frozen=True)
class StoreHealth:
    """What the store's health probe remembers (``driver.job.feeds.probe_store``): since
    when the store has not answered (None: it answers), when that was last said, and
    the last error."""

    down_since: float | None = None
    said_at: float | None = None
    error: str = ""


@dataclass(frozen=True)
class HostsView:
    """What the rules ask of the host manager, as of one moment."""

    usable: tuple[HostSlots, ...]
    blacklisted: tuple[str, ...] = ()
    all_blacklisted: bool = False
    next_release: float | None = None
    available_slots: int = 0
    none_listed: bool = False  # discovery's latest result lists no host (usable: kept ones)
    listed: tuple[str, ...] = ()  # every host of discovery's latest result, blacklisted too

    @classmethod
    def of(cls, hosts: HostManager) -> HostsView:
        return cls(
            usable=hosts.usable_hosts,
            blacklisted=hosts.blacklisted_hosts,
            all_blacklisted=hosts.all_blacklisted,
            next_release=hosts.next_release_time(),
            available_slots=hosts.available_slots,
            none_listed=hosts.lists_none,
            listed=tuple(h.host for h in hosts.known_hosts),
        )


class Step(NamedTuple):
    """Decisions, and the book after them."""

    decisions: tuple[Decision, ...]
    book: Book
