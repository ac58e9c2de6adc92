"""A training loop that logs the wall-clock time of every commit, for the recovery,
scale and host-cut benchmarks and the false-alarm run.

Each step: a fixed amount of compute (a matrix product; a few ms), one allreduce of a
small gradient-like vector, the update, ``state.commit()``. For the false-alarm run it
can load the process the way real training code does: ``--python-loop N`` adds a
pure-Python loop of N iterations to each step (it holds the GIL, handing it over only at
the interpreter's switch interval), and ``--gc-objects N --gc-every K`` keeps a graph of
N linked Python objects alive and forces a full ``gc.collect()`` every K steps (a pause
that holds the GIL throughout; staggered by rank, so the other workers are awake to
notice it), each logged as ``{"ev": "gc", "t": <end>, "seconds": <pause>}``.
After each commit the worker
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

    steps.py OUT_DIR [--work K] [--samples N] [--batch B] [--dim D]
             [--python-loop N] [--gc-objects N --gc-every K]
"""

from __future__ import annotations

import argparse
import gc
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
    parser.add_argument(
        "--python-loop", type=int, default=0, help="pure-Python loop iterations per step"
    )
    parser.add_argument(
        "--gc-objects", type=int, default=0, help="linked objects kept alive for the collector"
    )
    parser.add_argument(
        "--gc-every", type=int, default=0, help="steps between forced gc.collect() (0: never)"
    )
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

    # A chain of small lists closed into a cycle: all of them tracked by the collector,
    # none of them garbage, so every full collection walks the whole graph.
    graph: list[list] = [[i, None] for i in range(args.gc_objects)]
    for i, node in enumerate(graph):
        node[1] = graph[i - 1]

    def load(step: int) -> None:
        acc = 0
        for i in range(args.python_loop):
            acc += i * i % 7
        if args.gc_every <= 0:
            return
        stagger = elastic.rank() * args.gc_every // elastic.size()
        if (step + stagger) % args.gc_every == 0:
            began = time.perf_counter()
            gc.collect()
            record("gc", seconds=time.perf_counter() - began)

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
                load(state.steps)
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
