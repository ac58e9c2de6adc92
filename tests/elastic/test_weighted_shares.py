"""Pure-logic tests of a step's shares and their weighted combination: the global batch's
split, micro-batches, ``weighted_average``'s packing, and training simulated over any
sequence of world sizes against one process (the whole-job versions are in
``tests/system/jobs/test_global_batch.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import elastic
from elastic import state as state_module
from elastic.average import pack, unpack
from elastic.sampler import ElasticSampler, micro_pieces, rank_share, step_share
from elastic.state import ObjectState
from tests.support.linear_model import SAMPLER_SEED, Problem, gradient, one_process

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


def world_sum(messages) -> np.ndarray:
    """What an allreduce(op="sum") of the workers' messages returns."""
    return np.sum(np.stack(list(messages)), axis=0)


def world_step(offset: int, n: int, step_samples: int, size: int) -> list[tuple[int, int, int]]:
    return [step_share(offset, n, step_samples, r, size) for r in range(size)]


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 300),
    batch=st.integers(1, 40),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=60),
)
def test_every_step_takes_the_global_batch_whatever_the_world(n, batch, sizes):
    seen: list[int] = []
    offset, steps = 0, 0
    while offset < n:
        size = sizes[steps % len(sizes)]
        shares = world_step(offset, n, batch, size)
        step = min(batch, n - offset)
        assert {after for _, _, after in shares} == {offset + step}  # agreed progress
        lengths = [hi - lo for lo, hi, _ in shares]
        assert sum(lengths) == step and max(lengths) - min(lengths) <= 1  # even split
        assert (min(lengths) == 0) == (step < size)  # empty only when it cannot be helped
        for lo, hi, _ in shares:
            seen.extend(range(lo, hi))
        offset += step
        steps += 1
    assert sorted(seen) == list(range(n))  # exactly once
    assert steps == -(-n // batch)  # steps per epoch: independent of the world sizes


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300), batch=st.integers(1, 20), size=st.integers(1, 9))
def test_per_worker_batch_leaves_a_share_empty_only_with_fewer_left_than_workers(n, batch, size):
    offset = 0
    while offset < n:
        shares = [rank_share(offset, n, batch, r, size) for r in range(size)]
        left = n - offset
        assert all(hi > lo for lo, hi, _ in shares) == (left >= size)
        offset = shares[0][2]


@settings(max_examples=200, deadline=None)
@given(count=st.integers(0, 500), limit=st.one_of(st.none(), st.integers(1, 64)))
def test_micro_batches_are_the_fewest_even_pieces_within_the_limit(count, limit):
    pieces = micro_pieces(count, limit)
    assert [i for lo, hi in pieces for i in range(lo, hi)] == list(range(count))
    sizes = [hi - lo for lo, hi in pieces]
    if count == 0:
        assert pieces == []
        return
    assert len(pieces) == (1 if limit is None else -(-count // limit))
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    assert limit is None or max(sizes) <= limit


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 12), min_size=1, max_size=6), seed=st.integers(0, 99))
def test_weighted_average_is_the_mean_over_every_sample(counts, seed):
    """Each worker sends its mean over its samples (NaN when it has none); the packed sum
    unpacks to the mean over all samples, in the value's own structure."""
    if sum(counts) == 0:
        counts = [*counts, 1]
    rng = np.random.default_rng(seed)
    samples = [rng.normal(size=(c, 3)) for c in counts]
    with np.errstate(invalid="ignore"):
        means = [s.sum(0) / len(s) for s in samples]  # NaN for an empty share
    truth = np.concatenate(samples).mean(0)
    as_dict = unpack(world_sum(pack({"g": m}, c) for m, c in zip(means, counts)), {"g": means[0]})
    np.testing.assert_allclose(as_dict["g"], truth, rtol=1e-12, atol=1e-14)
    sent = world_sum(pack((m[:1], m[1:]), c) for m, c in zip(means, counts))
    parts = unpack(sent, (truth[:1], truth[1:]))
    assert isinstance(parts, tuple) and [p.shape for p in parts] == [(1,), (2,)]
    np.testing.assert_allclose(np.concatenate(parts), truth, rtol=1e-12, atol=1e-14)


def test_weighted_average_keeps_dtypes_and_refuses_bad_counts():
    total = world_sum([pack(np.ones(2, dtype=np.float32), 3), pack(np.zeros(2, np.float32), 1)])
    result = unpack(total, np.ones(2, dtype=np.float32))
    assert result.dtype == np.float32 and result.tolist() == [0.75, 0.75]
    assert unpack(pack(np.arange(2), 2), np.arange(2)).dtype == np.float64
    with pytest.raises(ValueError, match="count"):
        pack(np.ones(2), -1)
    with pytest.raises(ValueError, match="no sample"):
        unpack(pack(np.ones(2), 0), np.ones(2))


@pytest.mark.parametrize("size,batch,n", [(2, 8, 17), (3, 10, 302), (4, 4, 35), (6, 5, 95)])
def test_the_readme_split_averaging_means_gives_nan_and_weighting_does_not(size, batch, n):
    """``n mod (batch * size)`` in 1..size-1: the epoch's last step leaves a worker no
    sample. The mean of the workers' means is NaN; the weighted average is the step's mean."""
    assert 0 < n % (batch * size) < size
    values = np.arange(n, dtype=np.float64)
    offset = n - n % (batch * size)
    shares = [values[lo:hi] for lo, hi, _ in world_step(offset, n, batch * size, size)]
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning):
        means = [np.array([s.mean()]) for s in shares]
    assert np.isnan(sum(means) / size).all()  # allreduce(op="average")
    weighted = unpack(world_sum(pack(m, len(s)) for m, s in zip(means, shares)), means[0])
    assert weighted.tolist() == [values[offset:].mean()]


def simulated_training(problem: Problem, epochs: int, batch: int, micro, sizes) -> np.ndarray:
    """The workload's loop with every worker of each step simulated in turn, the world
    size of step ``i`` being ``sizes[i % len(sizes)]`` (a re-form between any two steps)."""
    x, y = problem.data()
    w = np.zeros(problem.features)
    steps = 0
    for epoch in range(epochs):
        order = elastic.sampler.epoch_order(problem.samples, epoch, True, SAMPLER_SEED)
        offset = 0
        while offset < problem.samples:
            size = sizes[steps % len(sizes)]
            shares = world_step(offset, problem.samples, batch, size)
            messages = []
            for lo, hi, _ in shares:
                idx = order[lo:hi]
                g = np.zeros(problem.features)
                for a, b in micro_pieces(len(idx), micro):
                    part = idx[a:b]
                    g += len(part) / len(idx) * gradient(w, x[part], y[part])
                messages.append(pack(g, len(idx)))
            w -= problem.lr * unpack(world_sum(messages), w)
            offset, steps = shares[0][2], steps + 1
    return w


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 64),
    micro=st.one_of(st.none(), st.integers(1, 16)),
    sizes=st.lists(st.integers(1, 8), min_size=1, max_size=12),
)
def test_training_equals_one_process_over_any_world_sizes(batch, micro, sizes):
    problem = Problem(samples=97)
    simulated = simulated_training(problem, 2, batch, micro, sizes)
    np.testing.assert_allclose(simulated, one_process(problem, 2, batch), rtol=0, atol=1e-12)


def test_sampler_modes_and_their_errors():
    elastic.init()  # a world of one
    sampler = ElasticSampler(23, shuffle=False, global_batch_size=5, max_micro_batch=2)
    shares = [idx.tolist() for idx in sampler.batches()]
    assert shares == [list(range(i, min(i + 5, 23))) for i in range(0, 23, 5)]
    assert [p.tolist() for p in sampler.micro_batches(np.arange(5))] == [[0, 1], [2, 3], [4]]
    assert sampler.micro_batches(np.arange(0)) == []
    with pytest.raises(ValueError, match="without a batch_size"):
        next(sampler.batches(4))
    with pytest.raises(ValueError, match="needs a batch_size"):
        next(ElasticSampler(5).batches())
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        next(ElasticSampler(5).batches(0))
    with pytest.raises(ValueError, match="global_batch_size must be >= 1"):
        ElasticSampler(5, global_batch_size=0)
    with pytest.raises(ValueError, match="max_micro_batch must be >= 1"):
        ElasticSampler(5, max_micro_batch=-1)
    assert elastic.weighted_average([np.ones(2)], 4)[0].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="no sample"):
        elastic.weighted_average(np.ones(2), 0)


@pytest.mark.parametrize("commit_every,fail_after", [(1, 3), (2, 3), (3, 5)])
def test_global_batch_resumes_exactly_after_rollback(commit_every, fail_after):
    elastic.init()
    state = ObjectState(batch=0, kept=[])
    with state_module.active(state):
        sampler = ElasticSampler(50, shuffle=True, seed=3, global_batch_size=7)
        for i, idx in enumerate(sampler.batches(start=state.batch)):
            state.kept = state.kept + list(idx)
            state.batch += 1
            if state.batch % commit_every == 0:
                state.commit()
            if i + 1 == fail_after:
                break
        state.restore()
        resumed = ElasticSampler(50, shuffle=True, seed=3, global_batch_size=7)
        for idx in resumed.batches(start=state.batch):
            state.kept = state.kept + list(idx)
            state.batch += 1
            state.commit()
    assert sorted(state.kept) == list(range(50)) and state.batch == 8
