"""How the running job is doing: training progress, and the store's reachability.

Said every so often rather than once per change: ``Progress`` at rank 0's first report
and then every ``--progress-interval``, ``StoreUnreachable`` at once and again while the
store is away, ``StoreBack`` when it answers again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from driver.events.base import Event, format_seconds, plural


@dataclass(frozen=True)
class Progress(Event):
    """Training progress, at rank 0's first report and then every
    ``--progress-interval``: round ``round`` of ``size`` workers, ``step`` commits held
    by its rank 0, and the commits per second over the last interval (None: not
    measured yet, or not now). ``back_from``: the step went back from this one since
    the last such event (the state lost, or resumed from an older snapshot);
    ``quiet_for``: seconds since rank 0 was last heard, when that is long (``step`` is
    that old)."""

    kind: ClassVar[str] = "progress"
    round: int
    size: int
    step: int
    steps_per_second: float | None
    back_from: int | None = None
    quiet_for: float | None = None

    def __str__(self) -> str:
        notes = []
        rate = self.steps_per_second
        if isinstance(rate, (int, float)):
            notes.append(f"{rate:.1f} steps/s")
        elif rate is not None:
            notes.append(f"{rate} steps/s")
        if self.back_from is not None:
            notes.append(f"went back from step {self.back_from}")
        if self.quiet_for is not None:
            notes.append(f"rank 0 not heard for {format_seconds(self.quiet_for)}")
        where = f"round {self.round}, {plural(self.size, 'worker')}"
        said = f" ({'; '.join(notes)})" if notes else ""
        return f"progress: {where}, step {self.step}{said}"


@dataclass(frozen=True)
class StoreUnreachable(Event):
    """The rendezvous store does not answer the driver (said at once, then every few
    seconds while it lasts); ``seconds``: how long so far, ``error``: the last error."""

    kind: ClassVar[str] = "store_unreachable"
    seconds: float
    error: str

    def __str__(self) -> str:
        return f"the rendezvous store is unreachable ({format_seconds(self.seconds)} so far): {self.error}"


@dataclass(frozen=True)
class StoreBack(Event):
    """The rendezvous store answers again, after ``seconds`` unreachable."""

    kind: ClassVar[str] = "store_back"
    seconds: float

    def __str__(self) -> str:
        return f"the rendezvous store is back after {format_seconds(self.seconds)}"
