"""Pure-logic tests: the sampler's partition of an epoch, and the choice of the sync root."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.job.chaos import next_kill_delay, pick_victim
from elastic.sampler import epoch_order, rank_share
from elastic.state import NumpyState, ObjectState, sync_root

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


def test_epoch_order_is_a_seeded_permutation():
    a = epoch_order(100, 3, True, 7)
    assert sorted(a) == list(range(100))
    assert np.array_equal(a, epoch_order(100, 3, True, 7))
    assert not np.array_equal(a, epoch_order(100, 4, True, 7))
    assert list(epoch_order(5, 0, False, 0)) == [0, 1, 2, 3, 4]
    assert len(epoch_order(0, 0, True, 0)) == 0


def test_rank_share_full_and_last_step():
    assert [rank_share(0, 100, 8, r, 4)[:2] for r in range(4)] == [
        (0, 8),
        (8, 16),
        (16, 24),
        (24, 32),
    ]
    # 10 left for 4 ranks of batch 8: 3,3,2,2 — every rank takes the step.
    assert [rank_share(90, 100, 8, r, 4)[:2] for r in range(4)] == [
        (90, 93),
        (93, 96),
        (96, 98),
        (98, 100),
    ]
    # 2 left for 4 ranks: two ranks get none but still take the step.
    assert [rank_share(98, 100, 8, r, 4) for r in range(4)] == [
        (98, 99, 100),
        (99, 100, 100),
        (100, 100, 100),
        (100, 100, 100),
    ]


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 300),
    batch=st.integers(1, 17),
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=60),
)
def test_any_sequence_of_world_sizes_covers_the_epoch_exactly_once(n, batch, sizes):
    """Each step may run at a different world size (a re-form between commits)."""
    seen: list[int] = []
    offset, step = 0, 0
    while offset < n:
        size = sizes[step % len(sizes)]
        shares = [rank_share(offset, n, batch, r, size) for r in range(size)]
        assert len({after for _, _, after in shares}) == 1  # every rank agrees on progress
        for lo, hi, _ in shares:
            seen.extend(range(lo, hi))
        offset = shares[0][2]
        step += 1
    assert sorted(seen) == list(range(n))


@pytest.mark.parametrize(
    "counts,root", [([3], 0), ([3, 3, 3], 0), ([2, 3, 3], 1), ([0, 0, 5, 1], 2)]
)
def test_sync_root_is_the_oldest_worker_with_the_newest_commit(counts, root):
    assert sync_root(counts) == root


def test_object_state_save_restore_is_a_deep_copy():
    s = ObjectState(epoch=1, history=[1])
    s.history.append(2)
    s.epoch = 5
    s.extra = "new"
    s.restore()
    assert (s.epoch, s.history) == (1, [1]) and not hasattr(s, "extra")


def test_numpy_state_in_place_updates_are_rolled_back():
    s = NumpyState(w=np.zeros(3), step=0)
    s.w += 1
    s.commit()
    s.w -= 10
    s.step = 7
    s.restore()
    assert list(s.w) == [1, 1, 1] and s.step == 0


def test_chaos_schedule_and_victims_are_seeded():
    import random

    a, b = random.Random(3), random.Random(3)
    delays = [next_kill_delay(a, 2.0) for _ in range(50)]
    assert delays == [next_kill_delay(b, 2.0) for _ in range(50)]
    assert all(1.0 <= d <= 3.0 for d in delays)
    assert pick_victim(random.Random(1), []) is None
    assert pick_victim(random.Random(1), ["b", "a"]) == pick_victim(random.Random(1), ["a", "b"])


@pytest.mark.parametrize("commit_every,fail_after", [(1, 7), (3, 7), (4, 8), (5, 2)])
def test_sampler_resumes_exactly_after_rollback_with_infrequent_commits(commit_every, fail_after):
    """Commits every few steps (the common Horovod pattern), a failure between commits:
    after restore the epoch continues from the last commit, no sample lost or repeated."""
    import elastic
    from elastic import state as state_module
    from elastic.sampler import ElasticSampler

    elastic.init()  # a world of one
    state = ObjectState(epoch=0, batch=0, kept=[])
    with state_module.active(state):
        sampler = ElasticSampler(100, shuffle=True, seed=3)
        for i, idx in enumerate(sampler.batches(10, start=state.batch)):
            state.kept = state.kept + list(idx)
            state.batch += 1
            if state.batch % commit_every == 0:
                state.commit()
            if i + 1 == fail_after:
                break
        state.restore()  # the failure: back to the last commit
        resumed = ElasticSampler(100, shuffle=True, seed=3)  # built anew, as after a re-form
        for idx in resumed.batches(10, start=state.batch):
            state.kept = state.kept + list(idx)
            state.batch += 1
            if state.batch % commit_every == 0:
                state.commit()
    assert sorted(state.kept) == list(range(100))


def test_sampler_built_outside_run_binds_when_iterated_inside():
    import elastic
    from elastic import state as state_module
    from elastic.sampler import PROGRESS_ATTR, ElasticSampler

    elastic.init()
    sampler = ElasticSampler(40, shuffle=False)
    state = ObjectState(batch=0)
    with state_module.active(state):
        for _idx in sampler.batches(10):
            state.batch += 1
            state.commit()
    assert getattr(state, PROGRESS_ATTR)["offsets"][4] == 40
