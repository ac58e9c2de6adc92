"""What the job knows of the training's progress (``driver.policy.reports``): the newest
commit rank 0 reported, the rate's window, and the snapshots known complete (the
snapshot writers' records, ``driver.job.handlers``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple


class ProgressSample(NamedTuple):
    """Rank 0 reported ``step`` commits, heard at ``at``."""

    at: float
    step: int


class SnapshotHeld(NamedTuple):
    """The newest complete snapshot on ``host``'s disk ("": in a folder every worker
    sees) is of ``step``."""

    host: str
    step: int


@dataclass(frozen=True)
class ProgressBook:
    """The progress rules' memory; replaced, never changed.

    ``step``, ``round_id``, ``at``: the newest step rank 0 published, its round, and
    when it came; ``seen``: its reports over the last progress interval, since the step
    last went back (the rate's window); ``back_from``: the step it went back from since
    the last progress line; ``said_at``: when the last progress line was said.
    ``commit_members``: the members of the round rank 0 last said it committed in (its
    progress record's ``commit_round``, while that round was the current one): each
    holds the newest commit, so leaving workers may go once one of them stays
    (``policy.departures``). ``snapshots``: the newest complete snapshot per host;
    ``snapshot_round``: the newest round whose snapshot is known to be complete.
    ``writer``: the worker whose progress record came at ``at`` ("": not said), rank 0
    of the round it was in (``policy.suspicion.silent_rank0``)."""

    step: int | None = None
    round_id: int = 0
    at: float | None = None
    seen: tuple[ProgressSample, ...] = ()
    back_from: int | None = None
    said_at: float | None = None
    commit_members: frozenset[str] = frozenset()
    snapshots: tuple[SnapshotHeld, ...] = ()
    snapshot_round: int = 0
    writer: str = ""

    def written_by(self, worker_id: str) -> ProgressBook:
        """The report just taken (``policy.reports.progress_reported``) was written by
        ``worker_id``."""
        return replace(self, writer=worker_id)

    def snapshot_complete(self, host: str, step: int, round_id: int = 0) -> ProgressBook:
        """A snapshot of ``step``, taken in round ``round_id``, is complete on ``host``'s
        disk ("": every worker's)."""
        kept = tuple(s for s in self.snapshots if s.host != host or s.step > step)
        if not any(s.host == host for s in kept):
            kept = (*kept, SnapshotHeld(host, step))
        return replace(self, snapshots=kept, snapshot_round=max(self.snapshot_round, round_id))
