"""Least squares trained with the README's torch loop, for the global-batch tests.

The torch twin of ``global_batch.py``: the model is a ``Linear`` layer without bias in
float64, its loss the mean of ``(x @ w - y)**2 / 2`` (the gradient of
``tests.support.linear_model``), the optimizer plain SGD made a
``DistributedOptimizer(op="sum")``, the data a ``DataLoader`` drawing micro-batches from
``elastic.torch.ElasticSampler(global_batch_size=B, max_micro_batch=M)``, and the state a
``TorchState``. Each micro-batch's mean loss is scaled by its weight, so the weights
after E epochs equal ``linear_model.one_process(E, B)`` whatever the world did. Writes
OUT_DIR/<worker id>.json as ``global_batch.py`` does; rank 0 prints ``progress <steps>``
every 10 steps.

    global_batch_torch.py OUT_DIR --global-batch B [--max-micro M] [--epochs E]
        [--step-time S] [--pause FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import elastic
import elastic.torch as et
from tests.support.linear_model import SAMPLER_SEED, Problem, wait_while_paused, write_result

PROGRESS_EVERY = 10


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--max-micro", type=int)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--step-time", type=float, default=0.0, help="simulated compute (s)")
    parser.add_argument("--pause", type=Path, help="no step while this file exists")
    args = parser.parse_args()

    torch.set_num_threads(1)
    problem = Problem()
    x, y = (torch.from_numpy(a) for a in problem.data())
    data = TensorDataset(x, y, torch.arange(problem.samples))
    model = torch.nn.Linear(problem.features, 1, bias=False).double()
    with torch.no_grad():
        model.weight.zero_()
    optimizer = et.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=problem.lr),
        named_parameters=model.named_parameters(),
        op="sum",
    )
    sampler = et.ElasticSampler(
        data,
        shuffle=True,
        seed=SAMPLER_SEED,
        global_batch_size=args.global_batch,
        max_micro_batch=args.max_micro,
    )
    loader = DataLoader(data, batch_sampler=sampler)
    state = et.TorchState(
        model=model,
        optimizer=optimizer,
        sampler=sampler,
        epoch=0,
        steps=0,
        sizes=[],
        visits=torch.zeros(problem.samples),
    )

    @elastic.run
    def train(state):
        for epoch in range(state.epoch, args.epochs):
            state.epoch = epoch
            sampler.set_epoch(epoch)
            for step in sampler.steps(loader, optimizer):
                time.sleep(args.step_time)  # simulated compute
                optimizer.zero_grad()
                seen = torch.zeros(problem.samples)
                for (xs, ys, idx), weight in step:  # none for an empty share
                    loss = 0.5 * ((model(xs).squeeze(1) - ys) ** 2).mean()
                    (weight * loss).backward()
                    seen[idx] = 1.0
                optimizer.step()
                state.visits += et.allreduce(seen, op="sum")
                state.steps += 1
                if not state.sizes or state.sizes[-1] != elastic.size():
                    state.sizes.append(elastic.size())
                state.commit()
                wait_while_paused(args.pause, state)  # live state == committed here
                if elastic.rank() == 0 and state.steps % PROGRESS_EVERY == 0:
                    print(f"progress {state.steps}", flush=True)

    train(state)
    write_result(args.out_dir, state, model.weight.detach().reshape(-1).tolist())
    elastic.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
