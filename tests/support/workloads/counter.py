"""A script that trains alone (no elastic-run) with a ``NumpyState`` whose value is
exact: after N steps its array holds N everywhere. With ``ELASTIC_CHECKPOINT_DIR`` set
its snapshots are written and resumed from; it prints ``resumed-at <step>`` (the step it
started from) and ``done <step> <value>`` at its end.

    counter.py STEPS [--elements K] [--step-time S]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import elastic


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("--elements", type=int, default=100_000)
    parser.add_argument("--step-time", type=float, default=0.005)
    args = parser.parse_args()
    elastic.init()
    state = elastic.NumpyState(w=np.zeros(args.elements), step=0)

    @elastic.run
    def train(state):
        print(f"resumed-at {state.step}", flush=True)
        while state.step < args.steps:
            state.w += 1
            state.step += 1
            state.commit()
            time.sleep(args.step_time)  # the step's compute, simulated: its length is the workload

    train(state)
    print(f"done {state.step} {state.w.min()} {state.w.max()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
