"""Pure parts of ``elastic.torch`` and what needs no world: bucket plans, the sampler's
share of an epoch, CUDA staging (with a stand-in device), TorchState's in-place restore,
and that ``import elastic`` stays free of torch."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from elastic.torch import TorchState
from elastic.torch._staging import HostStaging, from_transfer, transfer_view
from elastic.torch.buckets import ParamSpec, plan_buckets
from elastic.torch.sampler import (
    ElasticSampler,
    plan_steps,
    progress_after,
    rank_positions,
)
from tests.support.jobs import ROOT


def test_import_elastic_does_not_import_torch():
    code = "import sys, elastic; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=str(ROOT),
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=60,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_buckets_reverse_order_small_first_bucket_and_one_kind_each():
    specs = [
        ParamSpec(100, 4, "f32"),
        ParamSpec(100, 4, "f32"),
        ParamSpec(10, 2, "f16"),
        ParamSpec(300, 4, "f32"),
        ParamSpec(50, 4, "f32"),
    ]
    buckets = plan_buckets(specs, bucket_bytes=1000, first_bucket_bytes=200, alone_bytes=1000)
    # the last parameter fills the small first bucket; leftovers close in opening order
    assert [b.params for b in buckets] == [(4,), (3,), (2,), (1, 0)]
    assert buckets[3].fused == (1, 0) and buckets[3].offsets == (0, 100)
    assert buckets[3].numel == 200 and buckets[3].alone == ()
    assert buckets[1].alone == (3,) and buckets[1].fused == ()  # large: no packing
    assert {b.kind for b in buckets if 2 not in b.params} == {"f32"}
    with pytest.raises(ValueError):
        plan_buckets(specs, bucket_bytes=0)


@settings(max_examples=300, deadline=None)
@given(remaining=st.integers(0, 500), size=st.integers(1, 9), batch=st.integers(1, 40))
def test_sampler_shares_cover_the_rest_once_with_equal_steps(remaining, size, batch):
    shares = [rank_positions(remaining, r, size, batch) for r in range(size)]
    taken = np.concatenate(shares)
    assert set(taken.tolist()) == set(range(remaining))  # every position
    steps = {-(-len(s) // batch) for s in shares}
    assert len(steps) == 1  # same step count
    tail = remaining % (size * batch)
    if remaining:
        assert all(len(s) > 0 for s in shares)  # never empty
    # a repeat only when the epoch's last step has fewer samples than workers
    assert len(taken) == remaining + (size - tail if 0 < tail < size else 0)
    # a DataLoader's i-th batch on every rank comes from global step i's positions
    for i in range(steps.pop()):
        lo, hi = i * size * batch, progress_after(0, i + 1, batch, size, remaining)
        for s in shares:
            chunk = s[i * batch : (i + 1) * batch]
            assert all(lo <= p < hi for p in chunk.tolist())


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 200),
    processed=st.integers(0, 200),
    batch=st.integers(1, 40),
    size=st.integers(1, 8),
    micro=st.one_of(st.none(), st.integers(1, 16)),
)
def test_global_batch_plan_covers_the_rest_once_with_weights_adding_to_one(
    n, processed, batch, size, micro
):
    processed = min(processed, n)
    plans = [plan_steps(processed, n, batch, r, size, micro) for r in range(size)]
    assert {len(p) for p in plans} == {-(-(n - processed) // batch)}  # steps: not the world's
    before = processed
    for steps in zip(*plans):
        samples = steps[0].samples
        assert {(s.after, s.samples) for s in steps} == {(before + samples, samples)}
        assert steps[0].samples == min(batch, n - before)  # the global batch, or what is left
        assert sum(sum(s.weights) for s in steps) == pytest.approx(1.0)
        taken = sorted(i for s in steps for lo, hi in s.pieces for i in range(lo, hi))
        assert taken == list(range(before, steps[0].after))
        assert all(0 < hi - lo <= (micro or batch) for s in steps for lo, hi in s.pieces)
        before = steps[0].after


def test_global_batch_steps_group_the_loaders_micro_batches():
    import elastic

    elastic.init()  # a world of one
    data = TensorDataset(torch.arange(23.0))
    sampler = ElasticSampler(data, shuffle=False, global_batch_size=5, max_micro_batch=2)
    assert len(sampler) == 14  # 4 steps of 3 micro-batches, and 3 samples in 2
    seen, progress = [], []
    for number, step in enumerate(sampler.steps(DataLoader(data, batch_sampler=sampler))):
        progress.append(sampler.processed)  # counted when handed out
        if number == 1:
            continue  # a step left unread: the next one still starts at its own samples
        seen.append([(batch[0].tolist(), weight) for batch, weight in step])
        assert step.weight == 1.0 and step.samples == step.step_samples
    assert progress == [5, 10, 15, 20, 23]
    assert seen[0] == [([0.0, 1.0], 0.4), ([2.0, 3.0], 0.4), ([4.0], 0.2)]
    assert seen[1][0] == ([10.0, 11.0], 0.4)
    assert [[w for _, w in step] for step in seen[-1:]] == [[2 / 3, 1 / 3]]
    assert [list(map(int, b)) for step in sampler.steps() for b, _ in step] == []  # epoch done
    sampler.set_epoch(1)
    assert [b for step in sampler.steps() for b, _ in step][:1] == [[0, 1]]  # index lists


def test_global_batch_steps_stop_the_loaders_workers_at_the_end_of_the_epoch():
    import multiprocessing

    import elastic

    elastic.init()  # a world of one
    data = TensorDataset(torch.arange(10.0))
    sampler = ElasticSampler(data, shuffle=False, global_batch_size=4, max_micro_batch=2)
    loader = DataLoader(data, batch_sampler=sampler, num_workers=2)
    seen = []
    for step in sampler.steps(loader):
        seen += [float(x) for (batch,), _ in step for x in batch]
        assert multiprocessing.active_children()  # the loader's workers
    assert step is not None and seen == [float(i) for i in range(10)]
    # The loop's last step is still named, and the loader's workers are gone: a next
    # epoch would not fork new ones beside them, nor would exit wait for them.
    assert multiprocessing.active_children() == []
    # So too when the loop stops early (a failure, a new round), the step still named.
    sampler.set_epoch(1)
    for step in sampler.steps(loader):
        assert len(step) == 2 and multiprocessing.active_children()
        break
    assert step is not None and multiprocessing.active_children() == []


def test_global_batch_sampler_errors():
    data = range(10)
    with pytest.raises(ValueError, match="not both"):
        ElasticSampler(data, batch_size=2, global_batch_size=4)
    with pytest.raises(ValueError, match="needs global_batch_size"):
        ElasticSampler(data, max_micro_batch=2)
    with pytest.raises(ValueError, match="global_batch_size must be >= 1"):
        ElasticSampler(data, global_batch_size=0)
    with pytest.raises(ValueError, match="steps\\(\\) needs"):
        next(ElasticSampler(data).steps())
    sampler = ElasticSampler(data, global_batch_size=4)
    with pytest.raises(ValueError, match="steps\\(\\) records"):
        sampler.record_batch(0, 4)
    with pytest.raises(ValueError, match="batch_sampler=sampler"):
        next(sampler.steps(DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)))


def test_steps_set_the_optimizers_passes_and_want_a_sum():
    import elastic
    from elastic.torch import DistributedOptimizer

    elastic.init()
    data = TensorDataset(torch.arange(7.0, dtype=torch.float64).unsqueeze(1))

    def optimizer(model, op):
        return DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=1.0), model.named_parameters(), op=op
        )

    sampler = ElasticSampler(data, shuffle=False, global_batch_size=5, max_micro_batch=2)
    averaging = optimizer(torch.nn.Linear(1, 1), "average")
    with pytest.raises(ValueError, match='op="sum"'):
        next(sampler.steps(DataLoader(data, batch_sampler=sampler), averaging))
    model = torch.nn.Linear(1, 1, bias=False).double()
    opt = optimizer(model, "sum")
    passes, grads = [], []
    for step in sampler.steps(DataLoader(data, batch_sampler=sampler), opt):
        passes.append(opt.backward_passes_per_step)
        opt.zero_grad()
        for (x,), weight in step:
            (weight * model(x).mean()).backward()  # d/dw of the mean of w*x: the mean x
        opt.step()
        grads.append(float(model.weight.grad))  # type: ignore[arg-type]
    assert passes == [3, 1]  # 5 samples in 3 micro-batches, then 2 in 1
    assert grads == pytest.approx([2.0, 5.5])  # the mean x of each step: one process's


def test_backward_passes_per_step_is_set_between_steps():
    import elastic
    from elastic.torch import DistributedOptimizer

    elastic.init()
    model = torch.nn.Linear(2, 1)
    opt = DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    opt.backward_passes_per_step = 2
    for _ in range(2):
        model(torch.ones(1, 2)).sum().backward()
    with pytest.raises(RuntimeError, match="within a step"):
        opt.backward_passes_per_step = 1
    opt.step()
    opt.backward_passes_per_step = 1
    assert opt.backward_passes_per_step == 1
    with pytest.raises(ValueError, match=">= 1"):
        opt.backward_passes_per_step = 0


def test_object_state_warns_of_torch_objects_and_torch_state_does_not():
    import warnings

    import elastic

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(elastic.ReplacedStateWarning) as caught:
        elastic.ObjectState(model=model, optimizer=opt, scale=torch.ones(1), epoch=0)
    named = sorted(str(w.message).split("'")[1] for w in caught)
    assert named == ["model", "optimizer", "scale"]
    assert all("elastic.torch.TorchState" in str(w.message) for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TorchState(model=model, optimizer=opt, epoch=0).commit()


def test_sampler_progress_rides_through_state_dict():
    sampler = ElasticSampler(range(100), shuffle=True, seed=3, batch_size=4)
    sampler.set_epoch(2)
    sampler._size = 2
    sampler.record_batch(0, 4)
    sampler.record_batch(4, 4)
    assert sampler.processed == 40
    saved = sampler.state_dict()
    sampler.set_epoch(3)
    assert sampler.processed == 0
    sampler.load_state_dict(saved)
    sampler.set_epoch(2)  # the epoch in progress: kept
    assert (sampler.epoch, sampler.processed) == (2, 40)
    with pytest.raises(ValueError, match="num_samples"):
        ElasticSampler(range(5)).load_state_dict(saved)


def test_staging_goes_through_one_reused_host_buffer():
    synced: list[torch.device] = []
    staging = HostStaging(pin=False, is_device=lambda t: True, synchronize=synced.append)
    device_tensor = torch.arange(6.0).reshape(2, 3)
    host = staging.to_host(device_tensor)
    assert host is not device_tensor and torch.equal(host, device_tensor)
    assert staging.to_host(device_tensor * 2).data_ptr() == host.data_ptr()  # reused
    assert len(synced) == 2  # waited for each device-to-host copy
    out = torch.zeros(2, 3)
    staging.copy_to(torch.ones(6), out)
    assert torch.equal(out, torch.ones(2, 3)) and len(synced) == 3
    cpu = HostStaging(pin=False)
    t = torch.ones(3)
    assert cpu.to_host(t).data_ptr() == t.data_ptr()  # no copy


def test_transfer_views_share_memory_and_keep_bfloat16_bits():
    t = torch.arange(4, dtype=torch.float32)
    arr = transfer_view(t)
    arr[0] = 7
    assert t[0] == 7
    b = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert torch.equal(from_transfer(transfer_view(b).copy(), torch.bfloat16), b)
    with pytest.raises(ValueError):
        transfer_view(torch.ones(4, 4).t())


def test_torch_state_restores_into_the_same_objects():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    counts = torch.zeros(2)
    state = TorchState(
        model=model, optimizer=opt, scheduler=sched, counts=counts, epoch=0, history=[1]
    )
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched.step()
    counts += 1
    state.commit()
    weight, momentum = model.weight.detach().clone(), opt.state[model.weight]["momentum_buffer"]
    momentum = momentum.clone()
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched.step()
    counts += 5
    state.epoch, state.history = 4, [1, 2]
    state.restore()
    assert state.model is model and state.optimizer is opt and state.counts is counts
    assert torch.equal(model.weight, weight)
    assert torch.equal(opt.state[model.weight]["momentum_buffer"], momentum)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    assert counts.tolist() == [1.0, 1.0] and state.epoch == 0 and state.history == [1]
    # what was restored is the optimizer's own: stepping on does not alter the commit
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state.restore()
    assert torch.equal(model.weight, weight)


class _TwinWorld:
    """A stand-in world of two ranks that hold the same gradients: "sum" doubles them
    (logic only: which gradients are sent, late ones corrected, nothing lost)."""

    def __init__(self, monkeypatch):
        from elastic.torch import _backend

        self.calls: list[int] = []
        monkeypatch.setattr(_backend, "world_size", lambda: 2)
        monkeypatch.setattr(_backend, "allreduce_array", self.allreduce)

    def allreduce(self, arr, op):
        self.calls.append(arr.size)
        return arr * 2 if op == "sum" else arr.copy()  # "max" of equal masks: the mask


def test_reducer_sends_late_and_partial_gradients_once(monkeypatch):
    from elastic.torch import DistributedOptimizer

    twin = _TwinWorld(monkeypatch)
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    opt = DistributedOptimizer(
        torch.optim.SGD([a, b], lr=0.0), op="sum", backward_passes_per_step=2, bucket_bytes=8
    )
    assert len(opt.buckets) == 2
    # step 1: b gets no gradient (zeros on every rank); a accumulates two passes
    for _ in range(2):
        (a * 2).sum().backward()
    opt.step()
    assert a.grad is not None and b.grad is not None
    assert a.grad.tolist() == [8.0] * 3 and b.grad.tolist() == [0.0] * 2
    assert twin.calls == [2, 5]  # bucket of b; bucket of a with the "late" mask (2)
    opt.zero_grad()
    # step 2: b was not expected (no gradient last step) and gets one in pass 2 only,
    # after its bucket may have left: it is corrected, not lost and not doubled
    (a * 2).sum().backward()
    (a * 2).sum().backward(retain_graph=True)
    (b * 3).sum().backward()
    opt.step()
    assert a.grad.tolist() == [8.0] * 3 and b.grad.tolist() == [6.0] * 2
    with pytest.raises(RuntimeError, match="backward_passes_per_step"):
        for _ in range(3):
            (a * 2).sum().backward()
    opt.reset_step()
    # a step cut short leaves nothing behind: the next one counts from zero
    opt.zero_grad()
    for _ in range(2):
        (a * 1).sum().backward()
    opt.step()
    assert a.grad.tolist() == [4.0] * 3
