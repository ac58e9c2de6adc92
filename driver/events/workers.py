"""The events of one worker: started, exited, failed, stopped, reported, hung, chaos-killed;
a spare ready, promoted or lost.

Each names the worker by id, host and slot (and its rank while it is a member of the
round); ``code`` is an exit code (-N: killed by signal N).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from driver.events.base import Event, describe_code, worker_label


@dataclass(frozen=True)
class WorkerStarted(Event):
    kind: ClassVar[str] = "worker_started"
    quiet: ClassVar[bool] = True
    worker: str
    host: str
    slot: int  # a spare's: its index among its host's spares
    pid: int
    spare: bool = False

    def __str__(self) -> str:
        if self.spare:
            return f"spare {self.host}#{self.slot} started (pid {self.pid})"
        return f"{worker_label(self.host, self.slot)} started (pid {self.pid})"


@dataclass(frozen=True)
class SpareReady(Event):
    """A spare registered: it can be promoted at once (``took``: seconds since its start,
    the process start and imports a promotion saves)."""

    kind: ClassVar[str] = "spare_ready"
    quiet: ClassVar[bool] = True
    worker: str
    host: str
    took: float

    def __str__(self) -> str:
        return f"spare {self.worker} on {self.host} ready after {self.took:g}s"


@dataclass(frozen=True)
class SparePromoted(Event):
    """The registered spare ``worker`` took slot ``slot`` of its host: it is a candidate
    for the next round at once (``waited``: seconds it was idle)."""

    kind: ClassVar[str] = "spare_promoted"
    quiet: ClassVar[bool] = True
    worker: str
    host: str
    slot: int
    waited: float

    def __str__(self) -> str:
        return f"spare {self.worker} takes {self.host}:{self.slot}"


@dataclass(frozen=True)
class SpareLost(Event):
    """A spare exited before it was promoted (``code``; ``registered``: it had got as far
    as ``elastic.init()``), or could not be started (``code`` None and a ``reason``). No
    round changes; another spare is started in its place."""

    kind: ClassVar[str] = "spare_lost"
    quiet: ClassVar[bool] = True
    worker: str
    host: str
    code: int | None
    registered: bool
    reason: str | None = None

    def __str__(self) -> str:
        if self.code is None:
            return f"spare {self.worker} on {self.host} could not start: {self.reason}"
        return f"spare {self.worker} on {self.host} exited ({describe_code(self.code)})"


@dataclass(frozen=True)
class WorkerAdopted(Event):
    """A worker another driver launched, taken over with the job (known from its
    registration: ``pid`` on its host)."""

    kind: ClassVar[str] = "worker_adopted"
    quiet: ClassVar[bool] = True
    worker: str
    host: str
    slot: int
    pid: int

    def __str__(self) -> str:
        return f"{worker_label(self.host, self.slot)} adopted (pid {self.pid})"


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
        return (
            f"{worker_label(self.host, self.slot, self.rank)} exited ({describe_code(self.code)})"
        )


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
    # It ended after the training had finished (``driver.policy.exits``): a signal then
    # is no failure of the job; an error code of its own still is.
    after_finish: bool = False

    def __str__(self) -> str:
        label = worker_label(self.host, self.slot, self.rank)
        text = (
            f"{label} ended after the training finished"
            if self.after_finish
            else (f"{label} failed")
        )
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
        return f"stopping {worker_label(self.host, self.slot)}: {self.reason}"


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
        return f"{worker_label(self.host, self.slot)} stopped ({describe_code(self.code)})"


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
class WorkerHung(Event):
    """Worker ``worker``'s process lives but its training reached no collective for
    ``seconds`` (its hang timeout, ``--hang-timeout``), in ``round``: it is killed and
    replaced. ``reason`` says how long and where its training thread is (``file:line
    in function``); ``stacks`` is every thread's Python stack, which the driver's log
    shows after this event's line."""

    kind: ClassVar[str] = "hung"
    worker: str
    host: str
    slot: int
    rank: int | None
    round: int
    reason: str
    stacks: str

    def __str__(self) -> str:
        label = worker_label(self.host, self.slot, self.rank)
        return f"{label} ({self.worker}) is hung in round {self.round}, killing it: {self.reason}"


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
            f"chaos: killed {worker_label(self.host, self.slot, self.rank)} (pid {self.pid}), "
            f"kill {self.kill}"
        )
