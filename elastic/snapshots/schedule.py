"""Which commit to snapshot, and whose state a round adopts (pure).

* ``StepTimer`` keeps a moving average of the seconds between two commits;
* ``ask`` is rank 0's rule: once ``interval`` seconds have passed since the last
  snapshot (less the lead), ask for the commit that comes ``lead`` seconds from now (at
  least ``MIN_LEAD_STEPS`` commits ahead), so that every member hears of it through the
  store before it gets there;
* ``choose_source`` is a round's sync: the newest state any member holds, a live commit
  or a complete snapshot it can read, and who holds it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MIN_LEAD_STEPS = 2
"""A snapshot is asked for at least this many commits ahead (members may be one commit
apart when the request arrives)."""


@dataclass(frozen=True)
class StepTimer:
    """The seconds between two commits, as a moving average (None until two commits)."""

    last: tuple[int, float] | None = None  # (commits, when)
    seconds: float | None = None
    weight: float = 0.2

    def observe(self, commits: int, now: float) -> StepTimer:
        """The timer after commit ``commits`` at ``now``."""
        if self.last is None or commits <= self.last[0] or now < self.last[1]:
            return StepTimer((commits, now), self.seconds, self.weight)
        step = (now - self.last[1]) / (commits - self.last[0])
        seconds = (
            step if self.seconds is None else self.seconds + self.weight * (step - self.seconds)
        )
        return StepTimer((commits, now), seconds, self.weight)


def ask(
    commits: int, now: float, since: float, step_seconds: float | None, interval: float, lead: float
) -> int | None:
    """The commit to snapshot when one is due to be asked for at ``now`` (the last
    snapshot, or the round's start, was at ``since``); None while none is due or the
    step time is not known yet."""
    if step_seconds is None or now < since + interval - lead:
        return None
    ahead = math.ceil(lead / step_seconds) if step_seconds > 0 else MIN_LEAD_STEPS
    return commits + max(MIN_LEAD_STEPS, ahead)


@dataclass(frozen=True)
class Source:
    """Where a round's state comes from: member ``rank``'s live commit (``snapshot``
    False) or the snapshot it can read (True), of commit ``step``."""

    rank: int
    step: int
    snapshot: bool


def choose_source(offers: Sequence[tuple[int, int]]) -> Source:
    """The newest state among the members' ``(commits, readable snapshot step)`` offers,
    in rank order: the most commits, else a newer snapshot; a live commit before a
    snapshot of the same step (no disk to read), the lowest rank on a tie.

    Raises:
        ValueError: no offer.
    """
    if not offers:
        raise ValueError("no member offered a state")
    commits = [c for c, _ in offers]
    snapshots = [s for _, s in offers]
    best_commit, best_snapshot = max(commits), max(snapshots)
    if best_commit >= best_snapshot:
        return Source(commits.index(best_commit), best_commit, False)
    return Source(snapshots.index(best_snapshot), best_snapshot, True)
