"""What restart mode remembers (``driver.policy.restarts``): why the current world
ends, and how many worlds in a row failed as they started."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class WorldEnd(NamedTuple):
    """Why the current world of restart mode ends (every worker of it is stopped), and
    whether the next one counts as a restart (a failure: a worker failed or was killed,
    a host was lost) or not (the hosts changed on purpose)."""

    reason: str
    failure: bool


@dataclass(frozen=True)
class WorldBook:
    """Restart mode's memory; replaced, never changed. ``end``: why the current world
    ends (None: it runs); ``quick_failures``: worlds in a row ended by a worker's own
    error soon after their start."""

    end: WorldEnd | None = None
    quick_failures: int = 0
