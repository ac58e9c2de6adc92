"""One worker of ``benchmarks/snapshot_bench.py``: trains the 25M-parameter MLP of
``torch_bench.py`` data-parallel up to a step (every worker stops on the same one), keeping its state safe one of
several ways, and writes each step's duration.

* ``--impl ours`` (started by elastic-run): ``DistributedOptimizer`` and a ``TorchState``
  committed every step; ``--save none`` (commits only), ``snapshots`` (elastic-run's
  ``--checkpoint-dir`` does it, off the training path), or ``torch_save`` (rank 0 writes
  ``torch.save`` of the same state every ``--save-every`` steps, on the training path,
  as a script does itself);
* ``--impl ddp`` (started by the benchmark): PyTorch DDP on gloo; ``--save none`` or
  ``dcp_async`` (``torch.distributed.checkpoint.async_save`` every ``--save-every``
  steps: a collective, so every rank must save on the same step; the benchmark turns its
  interval into steps from the baseline's step time).

Writes OUT (rank 0) as JSON: the step durations (after the first 3 steps), the step
the first of them is of, the steps taken, and the steps the script saved at itself.
With ``--first FILE``, rank 0 writes ``<unix time> <step>`` there as soon as its first
step is done (the restart measurement reads it: when, and from which step), and prints
``progress <step>`` (how far a killed job got). With
``--resume``, DDP loads the newest ``dcp_async`` checkpoint in ``--dir`` first (ours
resumes by itself from elastic-run's ``--checkpoint-dir``).

    snapshot_train.py --impl ours --save snapshots --steps 300 --out result.json
    snapshot_train.py --impl ddp --save dcp_async --save-every 50 --rank R --world N \\
        --port P --dir DIR --steps 300 --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import Future
from typing import Any, cast

import torch
from torch import nn

from benchmarks.workloads.torch_train import build_model

WARMUP = 3  # steps left out of the durations (allocations, first collectives)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=["ours", "ddp"], required=True)
    parser.add_argument("--save", choices=["none", "snapshots", "torch_save", "dcp_async"])
    parser.add_argument("--save-every", type=int, default=100, help="steps between saves")
    parser.add_argument("--steps", type=int, default=300, help="the step to stop at")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--dir", help="where torch_save and dcp_async write")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--first", help="where rank 0 writes the first step's time and step")
    parser.add_argument("--resume", action="store_true", help="ddp: load the newest checkpoint")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, sample = build_model("mlp")
    if args.impl == "ours":
        return train_ours(args, model, sample)
    return train_ddp(args, model, sample)


def batch_of(rank: int, size: int, sample: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rank)
    return torch.randn(size, *sample, generator=generator), torch.randint(
        0, 10, (size,), generator=generator
    )


def write(out: str, durations: list[float], steps: int, saves: list[int]) -> None:
    """DURATIONS are those of the steps up to STEPS; SAVES the steps the script saved at."""
    kept = durations[WARMUP:]
    result = {"durations": kept, "first_step": steps - len(kept) + 1, "steps": steps}
    with open(out, "w") as f:
        json.dump({**result, "saves": len(saves), "save_steps": saves}, f)


def note_progress(first: str | None, done: int, step: int) -> None:
    """After this process's first step, ``<unix time> <step>`` in FIRST, written whole
    (the benchmark polls for it); ``progress <step>`` on stdout."""
    if first and done == 1:
        with open(first + ".tmp", "w") as f:
            f.write(f"{time.time():.6f} {step}\n")
        os.replace(first + ".tmp", first)
    print(f"progress {step}", flush=True)


def train_ours(args: argparse.Namespace, model: nn.Module, sample: tuple[int, ...]) -> int:
    import elastic
    import elastic.torch as et

    elastic.init()
    optimizer = et.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1e-3), named_parameters=model.named_parameters()
    )
    state = et.TorchState(model=model, optimizer=optimizer, step=0)
    loss_fn = nn.CrossEntropyLoss()
    durations: list[float] = []
    saves: list[int] = []  # the steps of the script's own (torch_save) saves

    @elastic.run
    def train(state):
        x, y = batch_of(elastic.rank(), args.batch, sample)
        while state.step < args.steps:
            begin = time.perf_counter()
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
            state.step += 1
            state.commit()
            saving = args.save == "torch_save" and state.step % args.save_every == 0
            if saving and elastic.rank() == 0:  # what a script does itself: on the training path
                path = os.path.join(args.dir, "checkpoint.pt")
                torch.save({"model": model.state_dict(), "step": state.step}, path + ".tmp")
                os.replace(path + ".tmp", path)
                saves.append(state.step)
            durations.append(time.perf_counter() - begin)
            if elastic.rank() == 0:
                note_progress(args.first, len(durations), state.step)

    train(state)
    if elastic.rank() == 0:
        write(args.out, durations, state.step, saves)
    elastic.shutdown()
    return 0


def train_ddp(args: argparse.Namespace, model: nn.Module, sample: tuple[int, ...]) -> int:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=args.world
    )
    net = nn.parallel.DistributedDataParallel(model)
    # async_save finishes its collectives in a background thread: on the training group
    # they would interleave with DDP's allreduces and deadlock, so it gets its own.
    saving = dist.new_group(backend="gloo") if args.save == "dcp_async" else None
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x, y = batch_of(args.rank, args.batch, sample)
    durations: list[float] = []
    pending: Future[Any] | None = None
    saves: list[int] = []
    steps = resume(args.dir, model) if args.resume else 0
    while steps < args.steps:
        begin = time.perf_counter()
        optimizer.zero_grad()
        loss_fn(net(x), y).backward()
        optimizer.step()
        steps += 1
        if args.save == "dcp_async" and steps % args.save_every == 0:
            if pending is not None:
                pending.result()  # one save at a time, as the DCP docs advise
            saves.append(steps)
            state = {"model": model.state_dict(), "step": steps}
            pending = cast(  # a Future unless given an async stager
                Future[Any],
                dcp.async_save(
                    state, checkpoint_id=os.path.join(args.dir, f"s{steps}"), process_group=saving
                ),
            )
        durations.append(time.perf_counter() - begin)
        if args.rank == 0:
            note_progress(args.first, len(durations), steps)
    if pending is not None:
        pending.result()
    if args.rank == 0:
        write(args.out, durations, steps, saves)
    dist.destroy_process_group()
    return 0


def resume(directory: str, model: nn.Module) -> int:
    """Load the newest complete ``s<step>`` checkpoint of DIR into MODEL; its step."""
    import torch.distributed.checkpoint as dcp

    steps = sorted(
        int(name[1:])
        for name in os.listdir(directory)
        if name.startswith("s") and os.path.exists(os.path.join(directory, name, ".metadata"))
    )
    if not steps:
        return 0
    weights = model.state_dict()
    state: dict[str, Any] = {"model": weights, "step": 0}
    dcp.load(state, checkpoint_id=os.path.join(directory, f"s{steps[-1]}"))
    model.load_state_dict(weights)  # loaded in place, tensor by tensor
    return int(state["step"])


if __name__ == "__main__":
    sys.exit(main())
