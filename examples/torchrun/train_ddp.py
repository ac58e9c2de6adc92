"""A torchrun script, as PyTorch's DDP tutorial writes them: it runs unchanged under
``torchrun`` and under ``elastic-run --restart-workers``.

    torchrun --nproc-per-node 2 examples/torchrun/train_ddp.py CKPT_DIR
    elastic-run --restart-workers -np 2 python examples/torchrun/train_ddp.py CKPT_DIR
    elastic-run --restart-workers --min-np 2 --max-np 8 --host-discovery-script ./hosts.sh \\
        python examples/torchrun/train_ddp.py /shared/ckpt

Nothing in it knows of ``elastic``: ``init_process_group`` reads ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` from the environment, a
``DistributedSampler`` gives each rank its share of every epoch, ``DistributedDataParallel``
averages the gradients. Rank 0 writes a checkpoint at the end of every epoch (model,
optimizer, the epochs done); a worker started again, by torchrun or by elastic-run after a
failure, loads it and goes on with the next epoch, whatever the world size is now.

The model is a small MLP on the handwritten digits (8x8 images, 10 classes,
``examples/data``). ``--log-every N`` prints a line every N steps of each rank (the first
step after a start included), for the benchmarks that time a restart
(``benchmarks/restart_bench.py``).
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

DATA = Path(__file__).resolve().parent.parent / "data" / "digits.csv.gz"
CHECKPOINT = "checkpoint.pt"


def load_digits() -> TensorDataset:
    """The training images and labels (a fixed 80% of the digits), pixels in [0, 1]."""
    with gzip.open(DATA, "rt") as f:
        raw = np.loadtxt(f, delimiter=",", dtype=np.float32)
    order = np.random.default_rng(1234).permutation(len(raw))
    raw = raw[order][: int(0.8 * len(raw))]
    return TensorDataset(torch.from_numpy(raw[:, :-1] / 16.0), torch.from_numpy(raw[:, -1]).long())


def make_model() -> nn.Module:
    torch.manual_seed(0)  # every rank starts from the same weights
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def make_sampler(dataset: TensorDataset, rank: int, world: int) -> DistributedSampler[int]:
    """This rank's share of every epoch (``set_epoch`` reshuffles, the same on all ranks)."""
    return DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)


def save_checkpoint(path: Path, model: nn.Module, optimizer, epoch: int, history: list) -> None:
    """Write the state after ``epoch`` whole: to a temporary file renamed over the old
    one, so a worker killed mid-write leaves the previous checkpoint intact."""
    partial = path.with_suffix(".partial")
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**state, "epoch": epoch, "history": history}, partial)
    os.replace(partial, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir", type=Path)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="images per step per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log-every", type=int, default=0, help="steps between step lines")
    parser.add_argument(
        "--timeout", type=float, help="seconds a collective may wait (torch's default: 30 min)"
    )
    args = parser.parse_args()

    # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT come from the environment.
    timeout = timedelta(seconds=args.timeout) if args.timeout else None
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)

    dataset = load_digits()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    first_epoch, history = 0, []
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = args.checkpoint_dir / CHECKPOINT
    if checkpoint.exists():  # a restart: go on after the last epoch done
        state = torch.load(checkpoint, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch, history = state["epoch"] + 1, state["history"]
    ddp = DDP(model)
    sampler = make_sampler(dataset, rank, world)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    print(f"rank {rank}/{world}: restart {restart}, starting at epoch {first_epoch}", flush=True)

    steps = 0
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            steps += 1
            if args.log_every and (steps == 1 or steps % args.log_every == 0):
                print(
                    f"rank {rank}/{world} restart {restart}: step {steps}, epoch {epoch}",
                    flush=True,
                )
        history.append({"epoch": epoch, "world_size": world, "restart": restart})
        if rank == 0:
            save_checkpoint(checkpoint, model, optimizer, epoch, history)
            print(f"epoch {epoch}: loss {loss.item():.4f}, {world} workers", flush=True)
        dist.barrier()  # nobody starts the next epoch before this one is on disk

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
