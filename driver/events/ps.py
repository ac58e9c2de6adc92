"""The events of the parameter-server shards: started, exited, restarted, and each
coordinated checkpoint written (``driver.ps.supervisor`` emits them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from driver.events.base import Event, describe_code, format_seconds


@dataclass(frozen=True)
class PsStarted(Event):
    """Shard ``shard`` (process ``pid``) serves at ``address``."""

    kind: ClassVar[str] = "ps_started"
    quiet: ClassVar[bool] = True
    shard: int
    address: str
    pid: int

    def __str__(self) -> str:
        return f"ps shard {self.shard} started on {self.address} (pid {self.pid})"


@dataclass(frozen=True)
class PsExited(Event):
    kind: ClassVar[str] = "ps_exited"
    shard: int
    code: int | None

    def __str__(self) -> str:
        return f"ps shard {self.shard} exited ({describe_code(self.code)})"


@dataclass(frozen=True)
class PsRestarted(Event):
    kind: ClassVar[str] = "ps_restarted"
    shard: int

    def __str__(self) -> str:
        return f"ps shard {self.shard} restarted"


@dataclass(frozen=True)
class CheckpointWritten(Event):
    """Coordinated checkpoint ``checkpoint`` of training step ``step`` is complete in
    ``path``; ``seconds``: training paused plus files written. ``final``: the shards
    stop with the job and this checkpoint holds their last state (it may repeat a
    checkpoint reported before, when nothing changed since)."""

    kind: ClassVar[str] = "checkpoint_written"
    quiet: ClassVar[bool] = True
    step: int
    path: str
    seconds: float
    checkpoint: int
    final: bool = False

    def __str__(self) -> str:
        return (
            f"{'final ' if self.final else ''}checkpoint {self.checkpoint} of step "
            f"{self.step} written in {format_seconds(self.seconds)} to {self.path}"
        )
