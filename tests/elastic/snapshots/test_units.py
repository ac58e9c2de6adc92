"""The pure parts of the workers' snapshots: how arrays are cut into parts, the codec's
round trip, when rank 0 asks for a snapshot, and whose state a round adopts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic.snapshots import codec
from elastic.snapshots.parts import cut
from elastic.snapshots.schedule import MIN_LEAD_STEPS, Source, StepTimer, ask, choose_source
from elastic.snapshots.settings import SnapshotSettings

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


@given(
    sizes=st.lists(st.integers(0, 1000), max_size=12),
    parts=st.integers(1, 6),
    chunk=st.integers(1, 300),
)
def test_every_byte_of_every_leaf_is_in_exactly_one_piece(sizes, parts, chunk):
    plan = cut(sizes, parts, chunk)
    assert len(plan) == parts
    covered: dict[int, list[tuple[int, int]]] = {}
    for part in plan:
        assert part == sorted(part)  # each part's file holds its pieces in order
        for piece in part:
            assert piece.nbytes <= chunk
            covered.setdefault(piece.leaf, []).append((piece.start, piece.stop))
    for leaf, size in enumerate(sizes):
        ranges = sorted(covered.get(leaf, []))
        assert ranges[0][0] == 0 and ranges[-1][1] == size
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_a_large_leaf_is_shared_out_among_the_writers():
    plan = cut([1000], parts=4, chunk=250)
    assert [sum(p.nbytes for p in part) for part in plan] == [250, 250, 250, 250]
    assert cut([1000], parts=4, chunk=250) == plan  # every writer computes the same cut
    with pytest.raises(ValueError):
        cut([1], parts=0)


def test_the_codec_keeps_large_arrays_apart_and_small_ones_inside():
    big = np.arange(codec.MIN_LEAF_BYTES, dtype=np.uint8).reshape(64, -1)
    small = np.zeros(3)
    values = {"w": big, "b": small, "epoch": 4, "nested": [big[:1], {"x": "y"}]}
    skeleton, leaves = codec.split(values)
    assert [(leaf.kind, leaf.nbytes) for leaf in leaves] == [("ndarray", big.nbytes)]
    back = codec.join(
        skeleton,
        [leaf.kind for leaf in leaves],
        [leaf.meta for leaf in leaves],
        [bytearray(leaf.data.read(0, leaf.nbytes)) for leaf in leaves],
    )
    assert np.array_equal(back["w"], big) and back["w"].flags.writeable
    assert np.array_equal(back["b"], small) and back["epoch"] == 4
    assert back["nested"][1] == {"x": "y"} and np.array_equal(back["nested"][0], big[:1])


def test_a_state_that_does_not_pickle_is_a_snapshot_error():
    with pytest.raises(codec.SnapshotError, match="cannot be written"):
        codec.split({"f": lambda: 1})


def test_rank_0_asks_for_a_commit_far_enough_ahead_once_an_interval_passed():
    # No step time yet: no ask.
    assert ask(10, now=100.0, since=0.0, step_seconds=None, interval=30, lead=1.0) is None
    # Not due yet (the ask comes `lead` before the interval ends).
    assert ask(10, now=28.0, since=0.0, step_seconds=0.01, interval=30, lead=1.0) is None
    # Due: a commit `lead` seconds ahead, never fewer than MIN_LEAD_STEPS.
    assert ask(10, now=29.0, since=0.0, step_seconds=0.01, interval=30, lead=1.0) == 110
    assert (
        ask(10, now=29.0, since=0.0, step_seconds=5.0, interval=30, lead=1.0) == 10 + MIN_LEAD_STEPS
    )


def test_the_step_timer_averages_the_time_between_commits():
    timer = StepTimer().observe(1, 10.0)
    assert timer.seconds is None
    timer = timer.observe(3, 11.0)
    assert timer.seconds == pytest.approx(0.5)
    timer = timer.observe(4, 12.0)  # 1 s: the average moves a fifth of the way
    assert timer.seconds == pytest.approx(0.6)
    assert timer.observe(4, 13.0).seconds == pytest.approx(0.6)  # no new commit


def test_a_round_adopts_the_newest_state_a_live_commit_before_a_snapshot():
    assert choose_source([(5, 0), (7, 0), (7, 3)]) == Source(1, 7, False)
    assert choose_source([(0, 40), (0, 42), (0, 42)]) == Source(1, 42, True)
    assert choose_source([(42, 42), (0, 42)]) == Source(0, 42, False)  # no disk to read
    assert choose_source([(10, 12)]) == Source(0, 12, True)
    with pytest.raises(ValueError):
        choose_source([])


def test_snapshot_settings_ask_ahead_at_most_a_quarter_of_the_interval():
    assert SnapshotSettings("/d", interval=30.0).ask_ahead == 1.0
    assert SnapshotSettings("/d", interval=0.4).ask_ahead == pytest.approx(0.1)
    with pytest.raises(ValueError):
        SnapshotSettings("/d", interval=0)
    assert SnapshotSettings.from_env({}) is None
    settings = SnapshotSettings.from_env(
        {"ELASTIC_CHECKPOINT_DIR": "rel", "ELASTIC_CHECKPOINT_INTERVAL": "2"}
    )
    assert settings is not None and settings.interval == 2.0 and settings.directory.startswith("/")
