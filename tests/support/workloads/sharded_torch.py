"""A small transformer-shaped model (an embedding, blocks, a head) sharded per block with
``et.fully_shard``, trained with Adam, gradient clipping and an LR schedule on the
global batches of ``ElasticSampler(global_batch_size=B)``; or the same training in one
plain process (``--reference``), for the tests to compare.

    sharded_torch.py OUT_DIR [--reference] [--epochs E] [--global-batch B]
        [--kill-flag F --kill-rank R --kill-at K] [--grow-to N --grow-at K]

With ``--kill-flag``: the worker of rank R SIGKILLs itself in the middle of step K
(after its forward, before its backward), once (the flag file is removed first), having
written the time into OUT_DIR/killed-at. With ``--grow-to N``: after step K's commit
the workers wait until the world has N workers again (the replacement). The end: OUT_DIR/result.json from rank 0 (the
full parameters, the steps, the world sizes seen, the visits) and OUT_DIR/<worker>.json
from each worker of the last round.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, WIDTH, BLOCKS, SEQ, SAMPLES = 32, 16, 2, 8, 96


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (SAMPLES, SEQ + 1), generator=g)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:], torch.arange(SAMPLES))


def build() -> tuple[Tiny, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = Tiny().double()
    return model, *optimizer_for(model)


def optimizer_for(model: nn.Module):
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)


def loss_of(model: nn.Module, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    logits = model(xs)
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ys.reshape(-1))


def reference(args: argparse.Namespace) -> int:
    from elastic.sampler import epoch_order

    model, optimizer, scheduler = build()
    xs, ys, _ = data().tensors
    for epoch in range(args.epochs):
        order = torch.from_numpy(epoch_order(SAMPLES, epoch, True, 3))
        for lo in range(0, SAMPLES, args.global_batch):
            rows = order[lo : lo + args.global_batch]
            optimizer.zero_grad()
            loss_of(model, xs[rows], ys[rows]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
    params = {n: p.detach().reshape(-1).tolist() for n, p in model.named_parameters()}
    (Path(args.out_dir) / "reference.json").write_text(json.dumps(params))
    return 0


def main() -> int:
    global WIDTH, BLOCKS  # the model's shape, set by --width and --blocks
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--kill-flag")
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument("--kill-at", type=int, default=6)
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--blocks", type=int, default=BLOCKS)
    parser.add_argument("--times", type=Path, help="rank 0 appends 'time steps' per commit")
    parser.add_argument("--torchrun", action="store_true", help="plain FSDP2 under torchrun")
    parser.add_argument("--grow-to", type=int, default=0, help="world size to wait for")
    parser.add_argument("--grow-at", type=int, default=12, help="after this step's commit")
    args = parser.parse_args()
    torch.set_num_threads(1)
    WIDTH, BLOCKS = args.width, args.blocks
    if args.reference:
        return reference(args)
    if args.torchrun:
        return plain_fsdp2(args)

    import elastic
    import elastic.torch as et

    et.init()
    model, _, _ = build()
    for block in model.blocks:
        et.fully_shard(block)
    et.fully_shard(model)
    optimizer, scheduler = optimizer_for(model)
    dataset = data()
    sampler = et.ElasticSampler(dataset, shuffle=True, seed=3, global_batch_size=args.global_batch)
    loader = DataLoader(dataset, batch_sampler=sampler)
    state = et.TorchState(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        sampler=sampler,
        epoch=0,
        steps=0,
        sizes=[],
        visits=torch.zeros(SAMPLES),
    )
    idle = dataset.tensors[0][:1], dataset.tensors[1][:1]

    @elastic.run
    def train(state):
        for epoch in range(state.epoch, args.epochs):
            state.epoch = epoch
            sampler.set_epoch(epoch)
            for step in sampler.steps(loader):
                optimizer.zero_grad()
                seen = torch.zeros(SAMPLES)
                shares = list(step)
                if not shares:  # an empty share still joins FSDP's collectives
                    shares = [((*idle, None), 0.0)]
                for (xs, ys, idx), weight in shares:
                    loss = weight * loss_of(model, xs, ys)
                    maybe_kill(args, state)
                    loss.backward()
                    if idx is not None:
                        seen[idx] = 1.0
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                state.visits += et.allreduce(seen, op="sum")
                state.steps += 1
                if not state.sizes or state.sizes[-1] != elastic.size():
                    state.sizes.append(elastic.size())
                state.commit()
                note_time(args.times, elastic.rank(), state.steps)
                if state.steps == args.grow_at:
                    wait_for_size(args.grow_to, state)

    train(state)
    named = model.named_parameters()
    full = {n: p.full_tensor().reshape(-1).tolist() for n, p in named}  # type: ignore[attr-defined]
    same_objects = all(
        p is q for p, q in zip(model.parameters(), optimizer.param_groups[0]["params"])
    )
    result = {
        "rank": elastic.rank(),
        "size": elastic.size(),
        "steps": state.steps,
        "sizes": state.sizes,
        "lr": scheduler.get_last_lr()[0],
        "same_objects": same_objects,
        "visits_min": float(state.visits.min()),
        "visits_max": float(state.visits.max()),
    }
    worker = os.environ.get("ELASTIC_WORKER_ID", f"rank{elastic.rank()}")
    (Path(args.out_dir) / f"{worker}.json").write_text(json.dumps(result))
    if elastic.rank() == 0:
        (Path(args.out_dir) / "result.json").write_text(json.dumps({**result, "params": full}))
    elastic.shutdown()
    return 0


def note_time(times: Path | None, rank: int, steps: int) -> None:
    if times is not None and rank == 0:
        with times.open("a") as f:
            f.write(f"{time.time()!r} {steps}\n")


def plain_fsdp2(args: argparse.Namespace) -> int:
    """The same training with torch's own FSDP2 under torchrun (the benchmark's peer):
    each rank takes every world-th sample of the step's global batch."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from elastic.sampler import epoch_order

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    model, optimizer, scheduler = build()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    xs, ys, _ = data().tensors
    steps = 0
    for epoch in range(args.epochs):
        order = torch.from_numpy(epoch_order(SAMPLES, epoch, True, 3))
        for lo in range(0, SAMPLES, args.global_batch):
            rows = order[lo : lo + args.global_batch][rank::size]
            optimizer.zero_grad()
            loss_of(model, xs[rows], ys[rows]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            steps += 1
            note_time(args.times, rank, steps)
    dist.destroy_process_group()
    return 0


#: how long the workers wait at most for the world to grow back (the test failed)
GROW_LIMIT = 120.0


def wait_for_size(size: int, state) -> None:
    """Wait until the world has ``size`` workers, re-forming when a round is pending
    (``HostsUpdatedInterrupt``), so that a replacement slow to start (importing torch)
    joins before the training ends. Raises TimeoutError after GROW_LIMIT."""
    import elastic

    deadline = time.monotonic() + GROW_LIMIT
    while elastic.size() < size:
        state.check_host_updates()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the world did not grow back to {size} in {GROW_LIMIT:.0f}s")
        time.sleep(0.01)


def maybe_kill(args: argparse.Namespace, state) -> None:
    import elastic

    if (
        args.kill_flag
        and state.steps == args.kill_at
        and elastic.rank() == args.kill_rank
        and os.path.exists(args.kill_flag)
    ):
        os.unlink(args.kill_flag)
        (Path(args.out_dir) / "killed-at").write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
