"""What the job's rules decide, and what they remember: plain values, no behaviour.

``driver.policy`` returns these; ``driver.job.loop`` carries them out, one handler per class.
A ``Step`` pairs decisions with the ``Book`` after them (the loop's memory between
decisions, replaced, never changed); a ``HostsView`` is what the rules ask of the host
manager, as of one moment.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple, Union

from driver.events import Event
from driver.hosts.manager import HostManager
from driver.hosts.slots import HostSlots
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


class WorldEnd(NamedTuple):
    """Why the current world of restart mode ends (every worker of it is stopped), and
    whether the next one counts as a restart (a failure: a worker failed or was killed,
    a host was lost) or not (the hosts changed on purpose)."""

    reason: str
    failure: bool


@dataclass(frozen=True)
class Book:
    """What the loop remembers between decisions; replaced, never changed.

    ``change_at``: when the membership first changed since the last round (the next
    round's formation time counts from it). ``done_slots``: slots whose worker finished
    (they are not refilled). ``all_failed_rounds``: rounds whose members all failed with
    an error code of their own; ``lost_rounds``: rounds whose members all died on their
    own, whatever the code or signal. ``no_hosts_since``/``no_hosts_said_at``: since
    when discovery lists no host, and when that was last said. ``progress_step``,
    ``progress_round``, ``progress_at``: the newest step rank 0 published, its round,
    and when it came; ``progress_seen``: (when, step) of its records over the last
    progress interval, since the step last went back (the rate's window);
    ``progress_back_from``: the step it went back from since the last progress line;
    ``progress_said_at``: when the last progress line was said
    (``driver.policy.reports``)."""

    started_at: float
    resets: int = 0
    failure_streak: int = 0
    np_registered_at: float | None = None
    broken_since: float | None = None
    waiting_reported: bool = False
    member_finished_at: float | None = None
    change_at: float | None = None
    all_failed_rounds: frozenset[int] = frozenset()
    done_slots: frozenset[tuple[str, int]] = frozenset()
    probing: frozenset[str] = frozenset()  # hosts whose reachability is being asked
    # When the driver learned that a worker's @elastic.run function returned having
    # committed the final step (its finish record, ``JobKeys.training_finished``): that
    # commit is the job's result, so no new round forms, no slot is refilled, the chaos
    # kills nobody, and what dies after it is no failure of the job (``policy.exits``).
    training_done_at: float | None = None
    # Failure reports of the current round: who reported, and who stands accused since
    # when and why (a kill waits for the accused's own silence: ``policy.suspicion``).
    reporters: frozenset[str] = frozenset()
    accused: tuple[tuple[str, float, str], ...] = ()
    lost_rounds: frozenset[int] = frozenset()
    no_hosts_since: float | None = None
    no_hosts_said_at: float | None = None
    progress_step: int | None = None
    progress_round: int = 0
    # The members of the round rank 0 last said it committed in (its progress record's
    # ``commit_round``, while that round was the current one): each holds the newest
    # commit, so leaving workers may go once one of them stays (``policy.departures``).
    commit_members: frozenset[str] = frozenset()
    progress_at: float | None = None
    progress_seen: tuple[tuple[float, int], ...] = ()
    progress_back_from: int | None = None
    progress_said_at: float | None = None
    # Hosts where no spare is started before a time (``policy.spares``): one of their
    # spares was just promoted, or died before it registered.
    spare_holds: tuple[tuple[str, float], ...] = ()
    # The newest snapshot of the workers' state known to be complete, per host whose disk
    # holds it ("": in a folder every worker sees), as (host, step).
    snapshots: tuple[tuple[str, int], ...] = ()
    # Hosts being preempted, waiting for the snapshot their workers stop after: (host,
    # the snapshot round asked for, until when it is waited for).
    draining: tuple[tuple[str, int, float], ...] = ()
    # Workers of drained hosts that leave at their next commit (``Leave``): (worker id,
    # until when; after that they are stopped).
    leaving: tuple[tuple[str, float], ...] = ()
    # The newest round whose snapshot is known to be complete.
    snapshot_round: int = 0
    # The last discovery error said, when, and how many failed runs went unsaid since
    # (``policy.reports.discovery_failed``); reset by a run that succeeds.
    discovery_error: tuple[str, float, int] | None = None
    # Restart mode (``policy.restarts``): why the current world ends (None: it runs), and
    # how many worlds in a row ended by a worker's own death soon after their start.
    world_end: WorldEnd | None = None
    quick_failures: int = 0

    @property
    def training_done(self) -> bool:
        """The training is complete (see ``training_done_at``)."""
        return self.training_done_at is not None

    def training_finished(self, now: float) -> Book:
        """The driver learned at ``now`` that the training is complete (kept from the
        first time it learned it)."""
        return self if self.training_done_at is not None else replace(self, training_done_at=now)

    def leaves(self, worker_id: str, until: float) -> Book:
        """``worker_id`` leaves at its next commit, stopped if still running at ``until``."""
        return replace(self, leaving=(*self.leaving, (worker_id, until)))

    def new_round(self) -> Book:
        """A round was published: the reports of the one before are settled."""
        return replace(self, reporters=frozenset(), accused=())

    def changed(self, now: float) -> Book:
        """The membership changed at ``now``."""
        return self if self.change_at is not None else replace(self, change_at=now)

    def snapshot_complete(self, host: str, step: int, round_id: int = 0) -> Book:
        """A snapshot of ``step``, taken in round ``round_id``, is complete on ``host``'s
        disk ("": every worker's)."""
        book = replace(self, snapshot_round=max(self.snapshot_round, round_id))
        kept = tuple((h, s) for h, s in self.snapshots if h != host or s > step)
        if not any(h == host for h, _ in kept):
            kept = (*kept, (host, step))
        return replace(book, snapshots=kept)

    def finished(self, host: str, slot: int, in_round: bool, now: float) -> Book:
        """The worker in ``host:slot`` exited 0 on its own (a member, if ``in_round``)."""
        return replace(
            self,
            done_slots=self.done_slots | {(host, slot)},
            member_finished_at=now if in_round else self.member_finished_at,
        )


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
