"""The job's events: its start, each round formed, a long wait, and its end.

These are the lines a user reads to follow the job as a whole; the events of one
worker, one host or one ps shard are in the modules beside this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from driver.events.base import Event, format_seconds, plural


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
        return f"round {self.round} formed: {plural(self.size, 'worker')} in {format_seconds(self.seconds)}"


@dataclass(frozen=True)
class WorldStarted(Event):
    """Restart mode (``--restart-workers``): world ``world`` started, ``size`` workers
    on ``hosts`` (in ``GROUP_RANK`` order), ``members`` their worker ids in rank order;
    ``restarts``: its ``TORCHELASTIC_RESTART_COUNT``; ``seconds`` from the change it
    answers (a worker's exit, a host lost or added) to its start."""

    kind: ClassVar[str] = "world_started"
    world: int
    restarts: int
    size: int
    hosts: Sequence[str]
    members: Sequence[str]
    seconds: float

    def __str__(self) -> str:
        restart = f" (restart {self.restarts})" if self.restarts else ""
        when = f", {format_seconds(self.seconds)} after the change" if self.world > 1 else ""
        workers = f"{plural(self.size, 'worker')} on {plural(len(self.hosts), 'host')}"
        return f"world {self.world}{restart} started: {workers}{when}"


@dataclass(frozen=True)
class WorldStopping(Event):
    """Restart mode: every worker of world ``world`` is stopped because of ``reason``;
    the next world is a restart (counted against ``--reset-limit``) when ``failure``."""

    kind: ClassVar[str] = "world_stopping"
    world: int
    reason: str
    failure: bool

    def __str__(self) -> str:
        counted = "a restart" if self.failure else "not counted as a restart"
        return f"world {self.world} stops ({self.reason}): every worker starts again ({counted})"


@dataclass(frozen=True)
class StateLost(Event):
    """Round ``round`` has no member of round ``previous``, and no snapshot holds the
    state they committed (up to step ``step``, as rank 0 last said): it is lost, and
    the new members start from the script's initial state, as ``--on-state-lost
    restart`` asked (without it the job ends instead). Never silent: every worker of a
    round died at once, or every host running one left the job."""

    kind: ClassVar[str] = "state_lost"
    round: int
    previous: int
    step: int | None = None

    def __str__(self) -> str:
        upto = f" (up to step {self.step})" if self.step is not None else ""
        return (
            f"round {self.round} has no worker of round {self.previous}: the state they "
            f"committed{upto} is lost; as --on-state-lost restart asks, training starts "
            "over from the script's initial state"
        )


@dataclass(frozen=True)
class Stopping(Event):
    """``signal`` asked the job to stop: round ``round`` (its ``size`` members) was asked
    for a final snapshot of the newest commit, after which its workers stop."""

    kind: ClassVar[str] = "stopping"
    signal: str
    round: int
    size: int

    def __str__(self) -> str:
        return (
            f"stopping on {self.signal}: round {self.round} ({plural(self.size, 'worker')}) "
            "writes a final snapshot first"
        )


@dataclass(frozen=True)
class JobStop(Event):
    """The job was stopped by ``signal``; ``step`` and ``path``: the snapshot the same
    command resumes from (None: there is none). (``elastic-run`` prints the reason
    itself, so it is quiet here.)"""

    kind: ClassVar[str] = "job_stopped"
    quiet: ClassVar[bool] = True
    signal: str
    reason: str
    step: int | None = None
    path: str | None = None
    seconds: float = 0.0

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class Waiting(Event):
    """A long wait, and what for (``waited``: seconds so far)."""

    kind: ClassVar[str] = "waiting"
    what: str
    waited: float

    def __str__(self) -> str:
        return f"waiting for {self.what} ({format_seconds(self.waited)} so far)"


@dataclass(frozen=True)
class TrainingFinished(Event):
    """A worker's training function returned in round ``round`` having committed step
    ``step``: that commit is the job's result (``driver.policy.exits.finished_outcome``);
    the others finish, or are told the training is done. ``host``/``slot``: the
    worker's (empty, -1 when the driver does not know it)."""

    kind: ClassVar[str] = "training_finished"
    round: int
    step: int
    worker: str = ""
    host: str = ""
    slot: int = -1

    def __str__(self) -> str:
        who = f"worker {self.host}:{self.slot}" if self.host else "a worker"
        return (
            f"training finished in round {self.round} at step {self.step} ({who} returned "
            "from its training function); the job ends as its workers exit"
        )


@dataclass(frozen=True)
class JobDone(Event):
    """Every member of the final round ``round`` (of ``size``) exited 0, with ``step``
    commits (None: the workers commit no state)."""

    kind: ClassVar[str] = "job_done"
    round: int
    size: int
    resets: int  # rounds that followed the first, not counting finishing ones
    step: int | None = None
    world: bool = False  # restart mode: ``round`` is the world, ``resets`` its restarts

    def __str__(self) -> str:
        at = f" at step {self.step}" if self.step is not None else ""
        if self.world:
            return (
                f"job done in world {self.round} ({plural(self.size, 'worker')}, "
                f"{plural(self.resets, 'restart')})"
            )
        return (
            f"job done in round {self.round}{at} ({plural(self.size, 'worker')}, "
            f"{plural(self.resets, 'reset')})"
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
class StandingBy(Event):
    """This driver is a standby of job ``job_id``, led by ``leader`` (its description)."""

    kind: ClassVar[str] = "standing_by"
    job_id: str
    leader: str
    term: int

    def __str__(self) -> str:
        return f"standing by for job {self.job_id}, led by {self.leader}"


@dataclass(frozen=True)
class Leading(Event):
    """This driver leads the job in ``term``: ``how`` "started" (a fresh job) or
    "adopted" (the job's workers ran without a leader: ``adopted`` of them taken over,
    ``previous`` the leader waited on, "" when none). ``seconds``: from the seat seen
    empty to this driver ready to form a round (0 for a fresh job)."""

    kind: ClassVar[str] = "leading"
    term: int
    how: str
    adopted: int
    previous: str
    seconds: float

    def __str__(self) -> str:
        if self.how != "adopted":
            return f"leading the job (term {self.term})"
        after = f" after {self.previous}" if self.previous else ""
        return (
            f"took over the job{after}: term {self.term}, {plural(self.adopted, 'worker')} "
            f"adopted, ready in {format_seconds(self.seconds)}"
        )


@dataclass(frozen=True)
class LeadershipLostEvent(Event):
    """Another driver took the job over; this one steers nothing more."""

    kind: ClassVar[str] = "leadership_lost"
    quiet: ClassVar[bool] = True
    reason: str

    def __str__(self) -> str:
        return self.reason
