"""What a ps shard restarted by the driver is said to lose (``driver.policy.ps_restarts``,
pure): the step it goes back to, from the steps the shards' records named."""

from __future__ import annotations

import pytest

from driver.policy.ps_restarts import ShardSteps, restart_event

pytestmark = pytest.mark.unit


def test_without_a_checkpoint_dir_the_state_since_step_0_is_lost():
    event = restart_event(0, False, ShardSteps())
    assert (event.checkpoint, event.step, event.reached) == (None, 0, None)
    assert str(event) == (
        "ps shard 0 restarted empty (no checkpoint: no --ps-checkpoint-dir): its state since "
        "step 0 is lost; its clients re-create its variables from their init() values"
    )


def test_before_the_first_checkpoint_it_comes_back_empty_too():
    event = restart_event(2, True, ShardSteps().with_step(35))
    assert str(event) == (
        "ps shard 2 restarted empty (no checkpoint was complete yet): its state since step 0 "
        "is lost; its clients re-create its variables from their init() values (the shards "
        "had reached step 35: at least 35 steps)"
    )


def test_from_the_newest_checkpoint_what_it_applied_after_it_is_lost():
    steps = ShardSteps().with_checkpoint(3, 90).with_checkpoint(4, 120)
    event = restart_event(1, True, steps)
    assert (event.checkpoint, event.step, event.reached) == (4, 120, None)
    assert str(event) == (
        "ps shard 1 restarted from checkpoint 4 at step 120: what it applied after step 120 is lost"
    )
    # A newer step named since (a failed attempt, a backup, a rollback): at least those.
    later = restart_event(1, True, steps.with_step(150))
    assert later.reached == 150 and str(later).endswith(
        "(the shards had reached step 150: at least 30 steps)"
    )


def test_the_steps_only_move_forward():
    steps = ShardSteps().with_checkpoint(4, 120).with_step(150)
    assert steps.with_checkpoint(3, 90) == ShardSteps(4, 120, 150)  # an older one, read again
    assert steps.with_step(None) == steps and steps.with_step(140) == steps
    assert steps.with_checkpoint(5, 160) == ShardSteps(5, 160, 160)
