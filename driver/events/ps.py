"""The events of the parameter-server shards: started, exited, restarted, rolled back
to an older step, each coordinated checkpoint written, and checkpoints that fail; under
``--ps-replicas 1`` a backup in step, a backup exited, and a failover to a backup
(``driver.ps`` emits them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from driver.events.base import Event, describe_code, format_seconds, plural


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
    """Shard ``shard`` was started again after its process died, and restores checkpoint
    ``checkpoint`` of step ``step`` (None and 0: it comes back empty; ``checkpoints``:
    the job writes checkpoints at all), so what it applied after ``step`` is lost;
    ``reached``: the newest step the shards' records named, when past ``step`` (the
    loss is at least the steps between). ``driver.policy.ps_restarts`` decides it."""

    kind: ClassVar[str] = "ps_restarted"
    shard: int
    checkpoint: int | None = None
    step: int = 0
    reached: int | None = None
    checkpoints: bool = False

    def __str__(self) -> str:
        if self.checkpoint is None:
            why = (
                "no checkpoint was complete yet"
                if self.checkpoints
                else "no checkpoint: no --ps-checkpoint-dir"
            )
            text = (
                f"ps shard {self.shard} restarted empty ({why}): its state since step 0 is "
                "lost; its clients re-create its variables from their init() values"
            )
        else:
            text = (
                f"ps shard {self.shard} restarted from checkpoint {self.checkpoint} at step "
                f"{self.step}: what it applied after step {self.step} is lost"
            )
        if self.reached is not None and self.reached > self.step:
            lost = plural(self.reached - self.step, "step")
            text += f" (the shards had reached step {self.reached}: at least {lost})"
        return text


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


@dataclass(frozen=True)
class CheckpointFailed(Event):
    """Coordinated checkpoints fail: attempt ``checkpoint`` in ``path``, of the shards'
    step ``step`` (None: not known), failed for ``error``, the last of ``attempts`` in
    a row (said at a streak's first failure, then at most once a minute). ``newest``
    is the newest complete checkpoint, of ``newest_step`` (None: there is none).
    ``final``: it was the checkpoint the shards stop with, so what they trained since
    ``newest`` is lost."""

    kind: ClassVar[str] = "checkpoint_failed"
    checkpoint: int
    step: int | None
    path: str
    error: str
    attempts: int
    final: bool = False
    newest: int | None = None
    newest_step: int | None = None

    def __str__(self) -> str:
        newest = f"checkpoint {self.newest} of step {self.newest_step}"
        if self.final:
            lost = ""
            if self.step is not None:
                lost = f" ({plural(self.step - (self.newest_step or 0), 'step')} lost)"
            resume = (
                "starts from the beginning" if self.newest is None else f"resumes from {newest}"
            )
            return (
                f"final ps checkpoint not written to {self.path}: {self.error}; "
                f"a restart {resume}{lost}"
            )
        has = "none is complete yet" if self.newest is None else f"the newest complete is {newest}"
        return (
            f"ps checkpoints fail ({plural(self.attempts, 'attempt')} in a row): "
            f"checkpoint {self.checkpoint} in {self.path}: {self.error}; {has}"
        )


@dataclass(frozen=True)
class PsRolledBack(Event):
    """A shard restarted from an older state than the shards had reached:
    ``from_step`` the step they had reached, ``to_step`` the step it restored (from
    ``checkpoint``; None: the empty start), so the updates of ``lost_steps`` steps are
    lost (sync: every shard went back; async: this shard's share of those updates)."""

    kind: ClassVar[str] = "ps_rolled_back"
    shard: int
    from_step: int
    to_step: int
    lost_steps: int
    checkpoint: int | None = None

    def __str__(self) -> str:
        source = f"checkpoint {self.checkpoint}" if self.checkpoint else "the empty start"
        return (
            f"ps shard {self.shard} restarted from {source} at step {self.to_step}, "
            f"behind the step {self.from_step} the shards had reached: "
            f"{plural(self.lost_steps, 'step')} lost"
        )


@dataclass(frozen=True)
class PsBackupReady(Event):
    """The backup of shard ``shard`` (process ``pid`` at ``address``) holds a copy of the
    shard's state (taken at step ``at_step``) and every update from then on before the
    shard acknowledges it: the shard may fail over to it."""

    kind: ClassVar[str] = "ps_backup_ready"
    shard: int
    address: str
    pid: int
    at_step: int

    def __str__(self) -> str:
        return (
            f"ps shard {self.shard} has a backup in step on {self.address} (pid {self.pid}, "
            f"copied at step {self.at_step})"
        )


@dataclass(frozen=True)
class PsBackupExited(Event):
    kind: ClassVar[str] = "ps_backup_exited"
    shard: int
    code: int | None

    def __str__(self) -> str:
        return (
            f"the backup of ps shard {self.shard} exited ({describe_code(self.code)}); "
            "starting another"
        )


@dataclass(frozen=True)
class PsFailedOver(Event):
    """Shard ``shard``'s primary at ``from_address`` died and its backup at
    ``to_address`` serves the shard since, at ``step``: it held every acknowledged
    update, so no step is lost and no shard rolled back."""

    kind: ClassVar[str] = "ps_failed_over"
    shard: int
    from_address: str
    to_address: str
    step: int

    def __str__(self) -> str:
        return (
            f"ps shard {self.shard} failed over from {self.from_address} to its backup on "
            f"{self.to_address} at step {self.step}: no step lost"
        )
