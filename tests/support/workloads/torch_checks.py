"""Checks of ``elastic.torch`` inside real workers (one process pays for the torch import
and runs them all). Each worker writes ``OUT_DIR/<worker>.json`` with what it saw; the
test (``tests/system/jobs/test_torch_jobs.py``) compares workers with each other and with the truth.

    torch_checks.py OUT_DIR collectives   # tensor collectives, parameter and optimizer
                                          # broadcast, TorchState, overlap, equality with
                                          # single-process training on the global batch
    torch_checks.py OUT_DIR train --steps N [--lr LR] [--kill-flag F --kill-at K]
        # trains under @elastic.run; with the flag file, rank 1 SIGKILLs itself in a
        # gradient hook of step K (after the first bucket started), once, having
        # written the time into OUT_DIR/killed-at; a worker whose step() raised
        # WorkerLostError writes the step into OUT_DIR/lost-<pid> and the time into
        # OUT_DIR/lost-at-<pid>

Each result also names the plane the tensors took (``plane``: "ring", "gloo" under
``ELASTIC_TORCH_BACKEND=gloo``, "nccl" for CUDA tensors), and a worker that trained on
after a loss the time its first step after it ended (``OUT_DIR/recovered-at-<pid>``).

``--device cuda`` runs every check on CUDA tensors (torch's default device), for
``benchmarks/gpu_check.py``; ``--nccl-hostid-per-worker`` gives each worker its own
``NCCL_HOSTID`` so that NCCL takes several ranks on one GPU: a trick for tests only (a
real job has one GPU per rank).

Training data are exact to share: step ``s`` uses a fixed global batch of ``GLOBAL``
rows (seeded by ``s``); each rank takes a contiguous part and its loss is the sum over
its rows divided by ``GLOBAL``, reduced with op="sum", so the gradient is the global
batch's whatever the world size, and a single process can compute the truth.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn

import elastic
import elastic.torch as et
from elastic.torch.plane import plane

GLOBAL = 12
DIM = 16


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(DIM, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)
        )
        self.unused = nn.Linear(3, 3)  # never in forward: gets no gradient

    def forward(self, x):
        return self.body(x)


def first_weight(model: Net) -> torch.Tensor:
    """The weight of the model's first layer."""
    layer = model.body[0]
    assert isinstance(layer, nn.Linear)
    return layer.weight


def make_model() -> Net:
    torch.manual_seed(0)
    return Net().double()


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)  # the same rows on every device
    x = torch.randn(GLOBAL, DIM, generator=g, dtype=torch.float64, device="cpu")
    y = torch.randn(GLOBAL, 4, generator=g, dtype=torch.float64, device="cpu")
    return x.to(torch.get_default_device()), y.to(torch.get_default_device())


def my_rows(rank: int, size: int) -> slice:
    base, extra = divmod(GLOBAL, size)
    lo = rank * base + min(rank, extra)
    return slice(lo, lo + base + (1 if rank < extra else 0))


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (model(x) - y).pow(2).sum() / GLOBAL


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(
        float((p - q).abs().max()) for p, q in zip(a.state_dict().values(), b.state_dict().values())
    )


def same_everywhere(model: nn.Module) -> bool:
    return len(set(elastic.allgather_object(digest(model)))) == 1


def check_collectives(rank: int, size: int) -> dict:
    out = {}
    t = torch.full((3, 2), float(rank + 1))
    out["allreduce_average"] = et.allreduce(t).tolist()
    in_place = t.clone()
    ptr = in_place.data_ptr()
    et.allreduce_(in_place, op="sum")
    out["allreduce_sum_in_place"] = [in_place.tolist(), in_place.data_ptr() == ptr]
    out["allreduce_int_max"] = et.allreduce(torch.tensor([rank, -rank]), op="max").tolist()
    out["broadcast"] = et.broadcast(torch.arange(4.0) + rank, root=1).tolist()
    target = torch.zeros(4, dtype=torch.bfloat16) + rank
    et.broadcast_(target, root=1)
    out["broadcast_bf16_in_place"] = target.float().tolist()
    out["allgather"] = et.allgather(torch.full((rank + 1, 2), rank)).tolist()
    out["bf16_allreduce"] = (
        et.allreduce(torch.ones(2, dtype=torch.bfloat16) * (rank + 1), op="sum").float().tolist()
    )
    return out


def check_broadcasts(rank: int, api=et) -> dict:
    """The state broadcasts of ``api`` (``elastic.torch``, or ``elastic.horovod``'s
    names for them: ``horovod_checks``), from rank 1's different state."""
    torch.manual_seed(rank)  # every rank starts different
    model = nn.Linear(5, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1))
    if rank == 1:
        model(torch.randn(2, 5)).sum().backward()
        opt.step()  # only rank 1 has Adam state
    weight = model.weight
    api.broadcast_parameters(model.state_dict(), root_rank=1)
    api.broadcast_optimizer_state(opt, root_rank=1)
    return {
        "params_same": same_everywhere(model),
        "same_object": model.weight is weight,
        "lr": opt.param_groups[0]["lr"],
        "adam_steps": float(opt.state[model.weight]["step"]) if opt.state else None,
    }


def check_state(rank: int) -> dict:
    model = make_model()
    opt = et.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    extra = torch.zeros(3)
    state = et.TorchState(model=model, optimizer=opt, scheduler=sched, extra=extra, n=0)
    x, y = batch(0)
    loss_of(model, x, y).backward()
    opt.step()
    sched.step()
    state.n, _ = 1, extra.add_(1)
    state.commit()
    committed = digest(model)
    for _ in range(2):  # train on past the commit, then roll back
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
        sched.step()
    state.n = 5
    extra.add_(10)
    state.restore()
    result = {
        "restored": digest(model) == committed,
        "lr": opt.param_groups[0]["lr"],
        "n": state.n,
        "extra": extra.tolist(),
        "same_objects": state.model is model and state.optimizer is opt and state.extra is extra,
        "momentum_kept": bool(opt.state[first_weight(model)]),
    }
    # sync adopts the worker with more commits: rank 1 commits once more
    if rank == 1:
        with torch.no_grad():
            first_weight(model).add_(1.0)
        state.n = 7
        state.commit()
    state.sync()
    result.update(
        synced_same=same_everywhere(model), synced_n=state.n, synced_lr=opt.param_groups[0]["lr"]
    )
    return result


def check_equality(rank: int, size: int, passes: int, compression, adam: bool) -> dict:
    """Distributed training against single-process training on the global batch."""
    model, truth = make_model(), make_model()

    def optimizer(m):
        if adam:
            return torch.optim.Adam(m.parameters(), lr=0.01)
        return torch.optim.SGD(m.parameters(), lr=0.1)

    opt = et.DistributedOptimizer(
        optimizer(model),
        named_parameters=model.named_parameters(),
        op="sum",
        backward_passes_per_step=passes,
        compression=compression,
        bucket_bytes=2048,
    )
    ref = optimizer(truth)
    worst, identical = 0.0, True
    for step in range(4):
        x, y = batch(step)
        rows = my_rows(rank, size)
        opt.zero_grad()
        for part in torch.tensor_split(torch.arange(GLOBAL)[rows], passes):
            loss_of(model, x[part], y[part]).backward()
        opt.step()
        ref.zero_grad()
        loss_of(truth, x, y).backward()
        ref.step()
        worst = max(worst, max_diff(model, truth))
        identical = identical and same_everywhere(model)
    return {
        "max_diff": worst,
        "identical_every_step": identical,
        "buckets": len(opt.buckets),
        "unused_grad_zero": bool(
            model.unused.weight.grad is not None and not model.unused.weight.grad.any()
        ),
    }


class _WaitForCommunication(torch.autograd.Function):
    """Identity whose backward (the last piece of backward to run, being first in
    forward) waits until the optimizer's first bucket started communicating: it
    returns only if communication overlaps backward."""

    @staticmethod
    def forward(ctx, x, timeline_of):
        ctx.timeline_of = timeline_of
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        deadline = time.monotonic() + 10
        while not ctx.timeline_of().started and time.monotonic() < deadline:
            time.sleep(0.001)
        ctx.overlapped = bool(ctx.timeline_of().started)
        OVERLAPPED.append(ctx.overlapped)
        return grad, None


OVERLAPPED: list[bool] = []  # one entry per backward of _WaitForCommunication


def check_overlap() -> dict:
    model = make_model()
    opt = et.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        bucket_bytes=2048,
    )
    x, y = batch(0)
    loss_of(model, x, y).backward()  # a first step shows which parameters get no gradient
    opt.step()
    opt.zero_grad()
    x.requires_grad_(True)  # so that the first op's backward runs
    loss_of(model, _WaitForCommunication.apply(x, lambda: opt.timeline), y).backward()
    timeline = opt.timeline
    assert timeline.last_hook is not None, "no gradient hook fired"
    before = min(timeline.launched.values()) < timeline.last_hook
    opt.step()
    synchronized = opt.last_timeline
    assert synchronized is not None, "the step did not synchronize"
    return {
        "waited_and_overlapped": OVERLAPPED == [True],
        "first_launch_before_last_hook": before,
        "buckets": len(opt.buckets),
        "hidden_fraction": synchronized.hidden_fraction(),
    }


def run_collectives(out_dir: Path) -> dict:
    rank, size = elastic.rank(), elastic.size()
    return {
        "collectives": check_collectives(rank, size),
        "broadcasts": check_broadcasts(rank),
        "state": check_state(rank),
        "overlap": check_overlap(),
        "sgd": check_equality(rank, size, 1, None, False),
        "accumulate": check_equality(rank, size, 2, None, False),
        "adam": check_equality(rank, size, 1, None, True),
        "fp16": check_equality(rank, size, 1, "fp16", False),
    }


def run_train(args) -> dict:
    model, truth = make_model(), make_model()
    opt = et.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        named_parameters=model.named_parameters(),
        op="sum",
        bucket_bytes=2048,
    )
    ref = torch.optim.SGD(truth.parameters(), lr=args.lr, momentum=0.9)
    state = et.TorchState(model=model, optimizer=opt, step=0, sizes=[])
    lost_at: list[float] = []  # when step() raised WorkerLostError here (once)
    recovered: list[float] = []  # when the first step after it ended

    def die_mid_bucket(_param):
        # rank 1, step K: the first bucket has been launched; die in the middle of backward
        if (
            args.kill_flag
            and elastic.rank() == 1
            and state.step == args.kill_at
            and opt.timeline.launched
            and os.path.exists(args.kill_flag)  # once: the rank 1 of a later round lives
        ):
            os.unlink(args.kill_flag)
            (Path(args.out_dir) / "killed-at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

    first_weight(model).register_post_accumulate_grad_hook(die_mid_bucket)

    @elastic.run
    def train(state):
        while state.step < args.steps:
            x, y = batch(state.step)
            rows = my_rows(elastic.rank(), elastic.size())
            opt.zero_grad()
            loss_of(model, x[rows], y[rows]).backward()
            try:
                opt.step()
                if lost_at and not recovered:  # the first step trained after a loss
                    recovered.append(time.time())
                    (Path(args.out_dir) / f"recovered-at-{os.getpid()}").write_text(
                        repr(recovered[0])
                    )
            except et.WorkerLostError:  # the state rolls back: note it in a file
                lost_at.append(time.time())
                with open(Path(args.out_dir) / f"lost-{os.getpid()}", "w") as f:
                    f.write(str(state.step))
                (Path(args.out_dir) / f"lost-at-{os.getpid()}").write_text(repr(lost_at[0]))
                raise
            state.step += 1
            if not state.sizes or state.sizes[-1] != elastic.size():
                state.sizes.append(elastic.size())
            state.commit()

    train(state)
    for step in range(args.steps):
        x, y = batch(step)
        ref.zero_grad()
        loss_of(truth, x, y).backward()
        ref.step()
    return {
        "max_diff": max_diff(model, truth),
        "steps": state.step,
        "sizes": state.sizes,
        "digest": digest(model),
        "lost_files": sorted(
            p.read_text() for p in Path(args.out_dir).glob("lost-*") if p.name[5:].isdigit()
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("mode", choices=["collectives", "train"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--kill-flag")
    parser.add_argument("--kill-at", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.1)  # long runs: lower, or it diverges
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--nccl-hostid-per-worker", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.nccl_hostid_per_worker:  # several NCCL ranks on one GPU: tests only
        os.environ["NCCL_HOSTID"] = os.environ.get("ELASTIC_WORKER_ID", str(os.getpid()))
    if args.device != "cpu":  # (a default device slows every torch call a little)
        torch.set_default_device(args.device)
    et.init()
    result = run_collectives(Path(args.out_dir)) if args.mode == "collectives" else run_train(args)
    result.update(rank=elastic.rank(), size=elastic.size(), plane=plane(args.device))
    worker = os.environ.get("ELASTIC_WORKER_ID", f"rank{elastic.rank()}")
    (Path(args.out_dir) / f"{worker}.json").write_text(json.dumps(result))
    elastic.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
