"""Least squares trained with the README's loop, for the global-batch tests.

Each step, each worker computes the mean gradient over its share (accumulated over its
micro-batches when --max-micro is given) and the world combines them with
``elastic.weighted_average``. With --global-batch every step takes that many samples
whatever the world size, so the weights after E epochs equal
``tests.support.linear_model.one_process(E, B)`` whatever the world did; with --batch
(per worker, the README's first loop) a step takes ``W * batch``.

--average-too also trains a second copy of the weights the way the README used to teach
(``allreduce(gradient, op="average")`` of each worker's mean), to show what a split does
to it. A one-hot of each step's samples is summed into ``visits``, so a test sees that
every sample was used exactly once per epoch. Each worker writes OUT_DIR/<worker id>.json;
rank 0 prints ``progress <steps>`` every 10 steps.

    global_batch.py OUT_DIR (--global-batch B | --batch B) [--max-micro M] [--epochs E]
        [--step-time S] [--average-too] [--pause FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import elastic
from tests.support.linear_model import (
    SAMPLER_SEED,
    Problem,
    gradient,
    wait_while_paused,
    write_result,
)

PROGRESS_EVERY = 10


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--global-batch", type=int, help="samples per step across the world")
    size.add_argument("--batch", type=int, help="samples per step and worker")
    parser.add_argument("--max-micro", type=int)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--step-time", type=float, default=0.0, help="simulated compute (s)")
    parser.add_argument("--pause", type=Path, help="no step while this file exists")
    parser.add_argument("--average-too", action="store_true")
    args = parser.parse_args()

    problem = Problem()
    x, y = problem.data()
    elastic.init()
    state: Any = elastic.NumpyState(
        w=np.zeros(problem.features),
        w_average=np.zeros(problem.features),
        visits=np.zeros(problem.samples),
        epoch=0,
        batch=0,
        steps=0,
        sizes=[],
    )

    @elastic.run
    def train(state):
        sampler = elastic.ElasticSampler(
            problem.samples,
            shuffle=True,
            seed=SAMPLER_SEED,
            global_batch_size=args.global_batch,
            max_micro_batch=args.max_micro,
        )
        for state.epoch in range(state.epoch, args.epochs):  # noqa: B020 - the README loop
            sampler.set_epoch(state.epoch)
            for idx in sampler.batches(batch_size=args.batch, start=state.batch):
                time.sleep(args.step_time)  # simulated compute
                if args.max_micro is None:  # the README's loop
                    g = gradient(state.w, x[idx], y[idx])  # NaN for an empty share
                else:  # gradient accumulation over micro-batches
                    g = np.zeros_like(state.w)
                    for part in sampler.micro_batches(idx):  # none for an empty share
                        g += len(part) / len(idx) * gradient(state.w, x[part], y[part])
                state.w -= problem.lr * elastic.weighted_average(g, len(idx))
                if args.average_too:  # the README's former loop
                    mean = gradient(state.w_average, x[idx], y[idx])
                    state.w_average -= problem.lr * elastic.allreduce(mean, op="average")
                seen = np.zeros(problem.samples)
                seen[idx] = 1.0
                state.visits += elastic.allreduce(seen, op="sum")
                state.batch += 1
                state.steps += 1
                if not state.sizes or state.sizes[-1] != elastic.size():
                    state.sizes.append(elastic.size())
                state.commit()
                wait_while_paused(args.pause, state)  # live state == committed here
                if elastic.rank() == 0 and state.steps % PROGRESS_EVERY == 0:
                    print(f"progress {state.steps}", flush=True)
            state.batch = 0

    train(state)
    write_result(args.out_dir, state, state.w.tolist(), w_average=state.w_average.tolist())
    elastic.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
