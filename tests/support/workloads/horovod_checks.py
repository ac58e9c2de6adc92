"""Checks of ``elastic.horovod`` inside real workers, through Horovod's names only (one
process pays for the torch import and runs them all). Each worker writes
``OUT_DIR/rank-<rank>.json`` with what it saw; ``tests/system/jobs/test_horovod_api.py``
compares it with what Horovod documents.

    horovod_checks.py OUT_DIR

Every rank calls the same collectives in the same order; a refused call (Adasum) is
refused before any collective, on every rank alike.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
import torch_checks  # type: ignore[import-not-found]  # (beside this script, on sys.path)
from torch import nn

import elastic.horovod as hvd


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def same_everywhere(model: nn.Module) -> bool:
    return len(set(hvd.allgather_object(digest(model)))) == 1


def check_layout() -> dict:
    return {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(),
        "cross_size": hvd.cross_size(),
        "is_initialized": hvd.is_initialized(),
        "mpi_enabled": hvd.mpi_enabled(),
        "mpi_threads_supported": hvd.mpi_threads_supported(),
        "gloo_enabled": hvd.gloo_enabled(),
        "nccl_built": hvd.nccl_built(),
    }


def check_collectives(rank: int) -> dict:
    out: dict = {}
    t = torch.full((2,), float(rank + 1))
    out["average_by_default"] = hvd.allreduce(t, name="avg").tolist()
    out["sum"] = hvd.allreduce(t, name="sum", op=hvd.Sum).tolist()
    out["average_false_is_sum"] = hvd.allreduce(t, average=False).tolist()
    out["min"] = hvd.allreduce(t, op=hvd.Min).tolist()
    out["max"] = hvd.allreduce(t, op=hvd.Max).tolist()
    out["scaled"] = hvd.allreduce(
        t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25
    ).tolist()
    fp16 = hvd.allreduce(torch.full((2,), 0.1 * (rank + 1)), compression=hvd.Compression.fp16)
    out["fp16"] = [fp16.tolist(), str(fp16.dtype)]
    in_place = t.clone()
    storage = in_place.data_ptr()
    result = hvd.allreduce_(in_place, op=hvd.Sum)
    out["in_place"] = [in_place.tolist(), result is in_place, in_place.data_ptr() == storage]
    out["allgather"] = hvd.allgather(torch.full((rank + 1, 1), rank)).tolist()
    out["broadcast"] = hvd.broadcast(torch.arange(3.0) + rank, root_rank=1).tolist()
    target = torch.zeros(3) + rank
    hvd.broadcast_(target, root_rank=1, name="target")
    out["broadcast_in_place"] = target.tolist()
    out["broadcast_object"] = hvd.broadcast_object({"from": rank}, root_rank=1)
    out["allgather_object"] = hvd.allgather_object(rank)
    hvd.barrier()
    try:
        hvd.allreduce(t, op=hvd.Adasum)
        out["adasum"] = None
    except hvd.HorovodUnsupportedError as exc:
        out["adasum"] = str(exc)
    return out


def check_broadcasts(rank: int) -> dict:
    return torch_checks.check_broadcasts(rank, hvd)  # the same check, Horovod's names


def one_step(rank: int, passes: int = 1, **options) -> list[float]:
    """The weight after one SGD step (lr 1) of a 4-input linear layer from zeros, each
    rank's gradient 0.1 * (rank + 1) in every entry per backward pass."""
    model = nn.Linear(4, 1, bias=False)
    nn.init.zeros_(model.weight)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=passes,
        **options,
    )
    opt.zero_grad()
    for _ in range(passes):
        model(torch.full((1, 4), 0.1 * (rank + 1))).sum().backward()
    opt.step()
    return model.weight.detach().flatten().tolist()


def check_optimizer(rank: int) -> dict:
    return {
        "average": one_step(rank),
        "sum": one_step(rank, op=hvd.Sum),
        "fp16": one_step(rank, compression=hvd.Compression.fp16),
        "two_passes_sum": one_step(rank, passes=2, op=hvd.Sum),
    }


def check_state(rank: int) -> dict:
    model = nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model, opt, epoch=1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    state.commit()
    committed = digest(model)
    with torch.no_grad():
        model.weight.add_(1.0)
    state.epoch = 5
    state.restore()
    result = {
        "positional": state.model is model and state.optimizer is opt,
        "restored": digest(model) == committed and state.epoch == 1,
    }
    if rank == 1:  # one commit more: the sync adopts rank 1's state, in place everywhere
        with torch.no_grad():
            model.weight.add_(2.0)
        state.epoch = 7
        state.commit()
    state.sync()
    result.update(synced_same=same_everywhere(model), synced_epoch=state.epoch)
    return result


def check_sampler(rank: int) -> dict:
    dataset = list(range(10))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=False)
    mine = list(sampler)
    everyone = hvd.allgather_object(mine)
    sampler.record_batch(0, 2)  # one batch of 2 per rank: 4 of the epoch consumed
    rest = hvd.allgather_object(list(sampler))
    return {"shares": everyone, "length": len(mine), "after_one_batch": rest}


def check_run(rank: int) -> dict:
    state = hvd.elastic.ObjectState(steps=0, seen=[])

    @hvd.elastic.run
    def train(state):
        for state.steps in range(state.steps, 3):  # noqa: B020 - the documented idiom
            total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
            state.seen.append(total.item())
            state.commit()
        return "done"

    return {"result": train(state), "seen": state.seen}


def main() -> int:
    out_dir = Path(sys.argv[1])
    hvd.init()
    rank = hvd.rank()
    result = {
        "layout": check_layout(),
        "collectives": check_collectives(rank),
        "broadcasts": check_broadcasts(rank),
        "optimizer": check_optimizer(rank),
        "state": check_state(rank),
        "sampler": check_sampler(rank),
        "run": check_run(rank),
    }
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(result))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
