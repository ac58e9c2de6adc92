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


def test_a_snapshot_found_on_disk_newer_than_any_heard_is_the_one_that_stands():
    # (written by rank 0 alone while the store was away: never announced)
    reason = "it has not answered for 13s, more than --elastic-timeout 12s"
    line = store_lost_line(reason, 50, (SnapshotHeld("", 84),), "/ckpt", on_disk=812)
    assert "the newest snapshot, of step 812, stands" in line
    line = store_lost_line(reason, 50, (SnapshotHeld("", 84),), "/ckpt", on_disk=None)
    assert "the newest snapshot, of step 84, stands" in line
    assert "of step 9, stands" in store_lost_line(reason, None, (), "/ckpt", on_disk=9)
