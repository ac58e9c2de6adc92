"""Linear regression on parameter-server shards, for tests under ``elastic-run --num-ps``.

Workers pull the weights, compute the gradient of the squared error on their batch and
push it, until the shards' global step reaches --steps. The final loss on the whole data
set, the step and the weights' checksum go to OUT_DIR/<worker id>.json.

    ps_linear.py OUT_DIR [--steps N] [--features F] [--optimizer sgd|momentum|adam]
        [--record-steps]

With --record-steps each worker appends every step its pushes returned (a step it saw
applied) to OUT_DIR/<worker id>.steps, one line each, as it goes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import elastic


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--pause-while", help="before each step, wait while this file exists")
    parser.add_argument("--record-steps", action="store_true")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, args.features))
    true_w = rng.normal(size=args.features)
    y = x @ true_w

    elastic.init()
    worker = os.environ.get("ELASTIC_WORKER_ID", f"rank{elastic.rank()}")
    steps_file = os.path.join(args.out_dir, f"{worker}.steps") if args.record_steps else None
    client = elastic.ps.connect()
    client.init(
        {"w": np.zeros(args.features), "b": np.zeros(1)}, optimizer=args.optimizer, lr=args.lr
    )
    state = elastic.ObjectState(epoch=0, batch=0)
    first_step = client.step

    @elastic.run
    def train(state):
        sampler = elastic.ElasticSampler(args.samples, shuffle=True, seed=1)
        while client.step < args.steps:
            sampler.set_epoch(state.epoch)
            for idx in sampler.batches(args.batch, start=state.batch):
                while args.pause_while and os.path.exists(args.pause_while):
                    time.sleep(0.01)  # simulated slow compute, held by the test
                params = client.pull()
                err = x[idx] @ params["w"] + params["b"][0] - y[idx]
                grads = {
                    "w": x[idx].T @ err / max(len(idx), 1),
                    "b": np.array([err.mean() if len(idx) else 0.0]),
                }
                step = client.push(grads)
                if steps_file:
                    with open(steps_file, "a") as f:
                        f.write(f"{step}\n")
                state.batch += 1
                state.commit()
                if step >= args.steps:
                    return
                if elastic.rank() == 0 and step % 10 == 0:
                    print(f"progress {step}", flush=True)
            state.epoch += 1
            state.batch = 0

    train(state)
    params = client.pull()
    loss = float(np.mean((x @ params["w"] + params["b"][0] - y) ** 2))
    with open(os.path.join(args.out_dir, f"{worker}.json"), "w") as f:
        json.dump(
            {
                "rank": elastic.rank(),
                "step": client.step,
                "first_step": first_step,
                "loss": loss,
                "initial_loss": float(np.mean(y**2)),
            },
            f,
        )
    client.close()
    elastic.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
