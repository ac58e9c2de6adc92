"""The ps shards' restart policy (pure): whether a shard whose process died is started
again or the job gives up on it (``RestartLimits``, ``count_death``, ``give_up``), and
what a restarted shard is said to lose (``restart_event``).

A shard dying over and over (more than ``max_restarts`` deaths of its processes within
``window`` seconds, its backup's deaths counted too) ends the job: restarting cannot fix
whatever kills it. The supervisor (``driver.ps.supervisor``) counts each death here.

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
class RestartLimits:
    """How often a shard's processes may die before the job gives up on it: more than
    ``max_restarts`` deaths within ``window`` seconds."""

    max_restarts: int = 10
    window: float = 60.0


def count_death(deaths: tuple[float, ...], now: float, limits: RestartLimits) -> tuple[float, ...]:
    """The deaths that still count at ``now`` (within ``limits.window``), with the one at
    ``now`` added: ``deaths`` are the earlier ones, oldest first."""
    return (*(t for t in deaths if t >= now - limits.window), now)


def give_up(
    index: int, deaths: tuple[float, ...], code: int | None, limits: RestartLimits
) -> str | None:
    """Why the job gives up on shard ``index`` after ``deaths`` (``count_death``'s
    answer; ``code``: the last exit), or None while a restart may still help."""
    if len(deaths) <= limits.max_restarts:
        return None
    return (
        f"ps shard {index} died {len(deaths)} times within {limits.window:g}s "
        f"(last exit: {code}); giving up"
    )


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
