"""The events of the workers' snapshots (``--checkpoint-dir``): one written, one that could
not be, and the one a round resumed from. The workers say these through the store
(``JobKeys.snapshots``); the driver turns each record into one of these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from driver.events.base import Event, format_seconds


def _where(path: str, host: str) -> str:
    return f"{path} on {host}" if host else path


@dataclass(frozen=True)
class SnapshotWritten(Event):
    """The snapshot of committed step ``step`` (round ``round``) is complete in ``path``
    (on ``host``'s own disk, when not ""); ``seconds`` from the commit to its
    manifest; ``final``: the one a stop asked for."""

    kind: ClassVar[str] = "snapshot_written"
    quiet: ClassVar[bool] = True
    step: int
    round: int
    path: str
    host: str
    seconds: float
    bytes: int
    final: bool = False

    def __str__(self) -> str:
        what = "final snapshot" if self.final else "snapshot"
        size = f"{self.bytes / 1e6:.1f} MB"
        return (
            f"{what} of step {self.step} written to {_where(self.path, self.host)} "
            f"({size} in {format_seconds(self.seconds)})"
        )


@dataclass(frozen=True)
class SnapshotFailed(Event):
    """The snapshot of step ``step`` in ``path`` could not be written, or could not be
    read back (``error``: why: a full disk, a worker that died while writing, a torn
    or corrupt file). ``previous``: the step of the newest complete snapshot the driver
    knows of there, which stands (None: there is none, so nothing on disk holds the
    state yet)."""

    kind: ClassVar[str] = "snapshot_failed"
    step: int
    path: str
    host: str
    error: str
    previous: int | None = None

    def __str__(self) -> str:
        stands = (
            f"the one of step {self.previous} stands"
            if self.previous is not None
            else "there is no earlier one: nothing on disk holds the state yet"
        )
        return (
            f"snapshot of step {self.step} in {_where(self.path, self.host)} is not usable "
            f"({self.error}); {stands}"
        )


@dataclass(frozen=True)
class SnapshotResumed(Event):
    """Round ``round`` took its state from the snapshot of step ``step`` in ``path``:
    no live worker held a newer commit (the job was started again, or every holder of
    the state was lost)."""

    kind: ClassVar[str] = "snapshot_resumed"
    step: int
    round: int
    path: str
    host: str

    def __str__(self) -> str:
        return f"round {self.round} resumes from the snapshot of step {self.step} in {_where(self.path, self.host)}"
