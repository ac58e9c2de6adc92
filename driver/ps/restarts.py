"""What a ps shard restarted by the driver loses, as the driver knows it (pure).

A shard whose process died, and that no backup in step takes over, is started again
with the same command line: it loads the newest complete checkpoint, or comes back
empty without one. Either way the updates it applied after that checkpoint (or since
step 0) are gone, and the restart says so at once, naming the shard and the step it
goes back to (``restart_event``), with no wait for the shard itself. What the driver
knows of the steps comes from the shards' records in the store (``ShardSteps``,
followed by ``driver.ps.records``): the newest complete checkpoint and the newest step
any record named. The exact count comes later when the restarted shard can compare
steps with its peers (``ps_rolled_back``); a lone shard has no peer to compare with,
and then the step range said here is all there is to know.
"""

from __future__ import annotations

from dataclasses import dataclass

from driver.events import PsRestarted


@dataclass(frozen=True)
class ShardSteps:
    """The shards' steps as their records told the driver: the newest complete
    checkpoint (``checkpoint``, None: none yet, and its ``checkpoint_step``), and the
    newest step any record named (``reached``: a checkpoint's, a failed attempt's, a
    backup's, a rollback's; None: none named one)."""

    checkpoint: int | None = None
    checkpoint_step: int = 0
    reached: int | None = None

    def with_checkpoint(self, checkpoint: int, step: int) -> ShardSteps:
        """These steps once checkpoint ``checkpoint`` of ``step`` is complete (an older
        one, read again, changes nothing but ``reached``)."""
        newer = self.checkpoint is None or checkpoint > self.checkpoint
        return ShardSteps(
            checkpoint if newer else self.checkpoint,
            step if newer else self.checkpoint_step,
            self.reached,
        ).with_step(step)

    def with_step(self, step: int | None) -> ShardSteps:
        """These steps once a record named ``step`` (None: it named none)."""
        if step is None or (self.reached is not None and step <= self.reached):
            return self
        return ShardSteps(self.checkpoint, self.checkpoint_step, step)


def restart_event(shard: int, checkpoints: bool, steps: ShardSteps) -> PsRestarted:
    """How the restart of ``shard`` is said: from the newest complete checkpoint when
    the job writes them (``checkpoints``: ``--ps-checkpoint-dir``) and one is complete,
    else empty, since step 0; with the newest step the shards were known to be at when
    it is past the one restored (what is lost is at least the steps between)."""
    checkpoint = steps.checkpoint if checkpoints else None
    restored = steps.checkpoint_step if checkpoint is not None else 0
    reached = steps.reached if steps.reached is not None and steps.reached > restored else None
    return PsRestarted(
        shard=shard,
        checkpoint=checkpoint,
        step=restored,
        reached=reached,
        checkpoints=checkpoints,
    )
