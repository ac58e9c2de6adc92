"""A training loop that logs the wall-clock time of every commit, for the recovery and
scale benchmarks.

Each step: a fixed amount of compute (a matrix product; a few ms), one allreduce of a
small gradient-like vector, the update, ``state.commit()``. After each commit the worker
appends one JSON line to ``OUT_DIR/<worker id>.commits``:

    {"ev": "commit", "t": <time.time()>, "worker": ..., "rank": ..., "size": ...,
     "round": <the round this commit belongs to>, "step": <global committed steps>}

and, once: ``start`` (the interpreter reached the script, before numpy and elastic are
imported; with the pid), ``init`` (just before ``elastic.init()``) and ``joined`` (after
it: registered, in a round, ring connected). The file is line-buffered and every line
is one ``write``, so a SIGKILLed worker leaves only whole lines behind (the reader
skips a torn last line anyway).

The job ends cleanly when the file ``OUT_DIR/stop`` appears: its presence is part of
each step's allreduce (as a max), so every member sees it on the same step and they
all return together; a worker that left on its own while the others still wait in a
collective would look like a failure to the driver.

    steps.py OUT_DIR [--work K] [--samples N] [--batch B]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

T_START = time.time()  # before the heavy imports: when the interpreter got this far

import numpy as np  # noqa: E402

import elastic  # noqa: E402
from elastic import context  # noqa: E402


def current_round() -> int:
    # The round number is not part of the public worker API; the benchmark needs it to
    # tell a commit that finished in the round a worker was killed in from the first
    # commit of the re-formed world (both can come after the kill).
    runtime = context.current_runtime()
    return runtime.round_id if runtime is not None else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument(
        "--work",
        type=int,
        default=160,
        help="side of the square matrices multiplied per step (compute)",
    )
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256, help="length of the allreduced vector")
    args = parser.parse_args()

    worker = os.environ.get("ELASTIC_WORKER_ID", f"pid{os.getpid()}")
    stop_path = os.path.join(args.out_dir, "stop")
    # Open for the life of the process: a worker may be SIGKILLed at any line.
    log = open(os.path.join(args.out_dir, f"{worker}.commits"), "a", buffering=1)  # noqa: SIM115

    def record(ev: str, t: float | None = None, **fields) -> None:
        log.write(json.dumps({"ev": ev, "t": time.time() if t is None else t, **fields}) + "\n")

    record("start", T_START, pid=os.getpid())

    rng = np.random.default_rng(0)
    a = rng.standard_normal((args.work, args.work))
    features = rng.standard_normal((args.samples, args.dim))

    record("init")
    elastic.init()
    record("joined", round=current_round())
    state = elastic.NumpyState(w=np.zeros(args.dim), epoch=0, batch=0, steps=0)

    @elastic.run
    def train(state):
        sampler = elastic.ElasticSampler(args.samples, shuffle=True, seed=1)
        for state.epoch in range(state.epoch, 1 << 30):  # noqa: B020 - the documented idiom
            sampler.set_epoch(state.epoch)
            for idx in sampler.batches(batch_size=args.batch, start=state.batch):
                a @ a  # stands in for the forward/backward pass; result not needed
                grad = np.empty(args.dim + 1)
                grad[:-1] = features[idx].sum(axis=0) - state.w * len(idx)
                grad[-1] = 1.0 if os.path.exists(stop_path) else 0.0
                total = elastic.allreduce(grad, op="sum")
                state.w += 1e-4 * total[:-1]
                state.batch += 1
                state.steps += 1
                state.commit()
                record(
                    "commit",
                    worker=worker,
                    rank=elastic.rank(),
                    size=elastic.size(),
                    round=current_round(),
                    step=state.steps,
                )
                if total[-1] > 0:
                    return
            state.batch = 0

    train(state)
    log.close()
    elastic.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
