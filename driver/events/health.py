"""How the running job is doing: training progress, and the store's reachability.

Said every so often rather than once per change: ``Progress`` every
``--progress-interval``, ``StoreUnreachable`` at once and again while the store is away,
``StoreBack`` when it answers again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from driver.events.base import Event, format_seconds, plural


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
        where = f"round {self.round}, {plural(self.size, 'worker')}"
        return f"progress: {where}, step {self.step}{per_second}"


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
