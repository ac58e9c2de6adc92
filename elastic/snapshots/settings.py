"""Where snapshots go and how often (``SnapshotSettings``), as ``elastic-run`` passes its
flags on to the workers (``ELASTIC_CHECKPOINT_DIR``, ``ELASTIC_CHECKPOINT_INTERVAL``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from rendezvous import env


@dataclass(frozen=True)
class SnapshotSettings:
    """``directory``: where snapshots go (absolute); ``interval``: seconds between two;
    ``keep``: complete snapshots kept (older ones are deleted once a newer is whole);
    ``lead``: seconds ahead of its commit that a snapshot is asked for (every member
    must hear of it before it commits that step; at most a quarter of the interval,
    ``ask_ahead``); ``part_deadline``: seconds the part 0 writer waits for the other
    parts before it abandons a snapshot.

    Raises (when made):
        ValueError: a value out of range.
    """

    directory: str
    interval: float = env.DEFAULT_CHECKPOINT_INTERVAL
    keep: int = 3
    lead: float = 1.0
    part_deadline: float = 120.0

    def __post_init__(self):
        if not self.directory:
            raise ValueError("a snapshot directory is required")
        if not self.interval > 0 or self.keep < 1 or not self.lead > 0:
            raise ValueError(f"unusable snapshot settings: {self}")
        if not self.part_deadline > 0:
            raise ValueError(f"unusable snapshot settings: {self}")

    @property
    def ask_ahead(self) -> float:
        """Seconds ahead of its commit that a snapshot is asked for."""
        return min(self.lead, self.interval / 4)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SnapshotSettings | None:
        """The settings ``elastic-run`` (or the user) gave this process; None when no
        directory is set (no snapshots).

        Raises:
            RendezvousConfigError: a variable does not parse (the message names it).
        """
        directory = env.text(env.ENV_CHECKPOINT_DIR, None, environ)
        if not directory:
            return None
        interval = env.number(env.ENV_CHECKPOINT_INTERVAL, env.DEFAULT_CHECKPOINT_INTERVAL, environ)
        return cls(directory=os.path.abspath(directory), interval=interval)
