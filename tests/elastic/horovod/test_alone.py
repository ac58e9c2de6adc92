"""``elastic.horovod`` in a world of one (the test process itself, as a script run alone
with ``python train.py``): the layout, the elastic state and sampler with Horovod's
signatures, and ``@hvd.elastic.run``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import elastic.horovod as hvd


@pytest.fixture(autouse=True)
def world_of_one():
    hvd.init()  # idempotent: the process's world of one


@pytest.mark.timeout(60)
def test_layout_and_build_answers_alone():
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)
    assert not hvd.mpi_enabled() and not hvd.mpi_threads_supported()
    assert not (hvd.gloo_enabled() or hvd.gloo_built() or hvd.nccl_built())
    assert hvd.cuda_built() == torch.backends.cuda.is_built()
    x = torch.tensor([1.0, 2.0])
    assert hvd.allreduce(x, name="x").tolist() == [1.0, 2.0]
    assert hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16).dtype == torch.float32


@pytest.mark.timeout(60)
def test_torch_state_takes_model_and_optimizer_by_position_and_resets_call_back():
    model = torch.nn.Linear(2, 1)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)
    assert state.model is model and state.optimizer is optimizer
    assert hvd.elastic.TorchState(epoch=0).model is None  # as in Horovod
    calls = []
    state.register_reset_callbacks([lambda: calls.append(hvd.size())])
    before = model.weight.detach().clone()
    state.commit()
    with torch.no_grad():
        model.weight.add_(1.0)
    state.batch = 9
    state.restore()
    assert torch.equal(model.weight, before) and state.batch == 0
    state.check_host_updates()  # a world of one never re-forms: nothing pending
    state.sync()
    state.on_reset()
    assert calls == [1]


@pytest.mark.timeout(60)
def test_object_state_takes_horovod_commons_arguments_and_ignores_them():
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, epoch=3)
    assert state.epoch == 3 and not hasattr(state, "bcast_object")
    state.epoch = 4
    state.restore()
    assert state.epoch == 3


@pytest.mark.timeout(60)
def test_elastic_sampler_progress_rides_with_the_torch_state():
    data = TensorDataset(torch.arange(10))
    sampler = hvd.elastic.ElasticSampler(data, shuffle=False)
    state = hvd.elastic.TorchState(train_sampler=sampler, epoch=0)
    loader = DataLoader(data, batch_size=3, sampler=sampler)
    taken = []
    for batch_idx, (batch,) in enumerate(loader):
        taken.append(batch.tolist())
        sampler.record_batch(batch_idx, 3)
        if batch_idx == 1:
            break
    state.commit()  # 6 of 10 consumed
    assert taken == [[0, 1, 2], [3, 4, 5]]
    sampler.record_batch(2, 3)  # a batch past the commit, lost with a worker
    state.restore()
    sampler.reset()  # Horovod's: nothing to do, the world is read at each pass
    assert [b.tolist() for (b,) in loader] == [[6, 7, 8], [9]]
    sampler.set_epoch(0)  # the epoch in progress: its progress stays
    assert len(sampler) == 4
    sampler.set_epoch(1)
    assert len(sampler) == 10


@pytest.mark.timeout(60)
def test_run_syncs_and_calls_the_function():
    state = hvd.elastic.ObjectState(steps=0)

    @hvd.elastic.run
    def train(state, until):
        while state.steps < until:
            state.steps += 1
            state.commit()
        return state.steps

    assert train(state, 3) == 3
