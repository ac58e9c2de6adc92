"""Lapses the store may explain, and the line of a store lost past its bound (pure)."""

from __future__ import annotations

from driver.policy.lapses import LAPSE_WINDOW, lapse_explained, store_lost_line
from driver.policy.memory.progress import SnapshotHeld


def test_a_lapse_is_explained_only_by_recent_trouble():
    assert not lapse_explained(None, 100.0)
    assert lapse_explained(100.0 - LAPSE_WINDOW, 100.0)
    assert not lapse_explained(100.0 - LAPSE_WINDOW - 0.1, 100.0)


def test_the_store_lost_line_names_the_step_heard_and_what_stands():
    reason = "watch lost its store (for more than --elastic-timeout 5s)"
    line = store_lost_line(
        reason, 1857, (SnapshotHeld("", 1500), SnapshotHeld("h1", 1200)), "/ckpt"
    )
    assert line.startswith(f"lost the rendezvous store: {reason}")
    assert "the newest step heard committed was 1857" in line
    assert "the newest snapshot, of step 1500, stands in --checkpoint-dir /ckpt" in line
    assert "no --checkpoint-dir" in store_lost_line(reason, 3, (), None)
    assert "no snapshot was completed yet" in store_lost_line(reason, None, (), "/ckpt")
