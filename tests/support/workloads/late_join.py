"""A short training loop for tests of workers that join late or finish early.

Each step adds the world size to ``total`` (an allreduce of ones), so every worker of a
job ends with the same ``total`` and ``steps`` or the state was lost somewhere. Rank 0
prints ``progress <steps>`` every 10 steps. Each worker writes OUT_DIR/<worker id>.json.

--hold DIR: a worker that finds DIR/hold when it starts is slow to start, as one that
imports torch: it writes DIR/<worker id>.waiting and calls ``elastic.init()`` (which
registers it) only once DIR/go exists.

--linger DIR: the first time the loop ends in a world of one, the function waits until a
newer round is pending before it returns (DIR/lingering says it waits), so that a round
forms exactly as training ends.

    late_join.py OUT_DIR --steps N [--step-time S] [--hold DIR] [--linger DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import elastic
import elastic.context

PROGRESS_EVERY = 10
WAIT_LIMIT = 120.0  # seconds a held or lingering worker waits at most


def wait_for(predicate, what: str) -> None:
    """Poll ``predicate`` until true; exit 3 after WAIT_LIMIT (the test failed)."""
    deadline = time.monotonic() + WAIT_LIMIT
    while not predicate():
        if time.monotonic() > deadline:
            print(f"gave up waiting for {what}", file=sys.stderr, flush=True)
            sys.exit(3)
        time.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-time", type=float, default=0.0, help="simulated compute (s)")
    parser.add_argument("--hold", type=Path)
    parser.add_argument("--linger", type=Path)
    args = parser.parse_args()
    worker = os.environ.get("ELASTIC_WORKER_ID", "alone")

    if args.hold is not None and (args.hold / "hold").exists():
        (args.hold / f"{worker}.waiting").write_text("")
        wait_for((args.hold / "go").exists, "the go file")  # slow "imports"

    elastic.init()
    state: Any = elastic.NumpyState(steps=0, total=np.zeros(1), sizes=[])
    lingered = False

    @elastic.run
    def train(state):
        nonlocal lingered
        while state.steps < args.steps:
            time.sleep(args.step_time)
            state.total += elastic.allreduce(np.ones(1), op="sum")
            state.steps += 1
            if not state.sizes or state.sizes[-1] != elastic.size():
                state.sizes.append(elastic.size())
            state.commit()
            if elastic.rank() == 0 and state.steps % PROGRESS_EVERY == 0:
                print(f"progress {state.steps}", flush=True)
        if args.linger is not None and elastic.size() == 1 and not lingered:
            lingered = True
            (args.linger / "lingering").write_text(str(state.steps))
            wait_for(lambda: elastic.context.pending_round() is not None, "a newer round")

    train(state)
    Path(args.out_dir, f"{worker}.json").write_text(
        json.dumps(
            {
                "rank": elastic.rank(),
                "size": elastic.size(),
                "steps": state.steps,
                "total": float(state.total[0]),
                "sizes": state.sizes,
            }
        )
    )
    elastic.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
