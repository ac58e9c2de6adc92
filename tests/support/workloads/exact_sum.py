"""A training loop whose result is exact, for chaos tests.

Every step each rank contributes, for its share of the epoch's samples, a vector with a 1
at each sample's index and the sum of the samples' values; the allreduced sum is added to
the state. All numbers are small integers held in float64, so the result is exact and
independent of how samples were grouped into steps or ranks: after E epochs every sample
was visited exactly E times, whatever failures and re-forms happened, or the job is wrong.

Each worker writes its final state to OUT_DIR/<worker id>.json; rank 0 prints
``progress <commits>`` every PROGRESS_EVERY commits so a test can time its kills.

    exact_sum.py OUT_DIR [--samples N] [--epochs E] [--batch B] [--work K]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time

import numpy as np

import elastic

PROGRESS_EVERY = 10


def held(gate: str, commits: int) -> bool:
    """Whether the test holds training at ``commits``: the gate file exists and names a
    commit count (empty: 0) the job has reached. Every rank holds at the same step, as
    the count is the committed state's."""
    try:
        with open(gate) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return False
    return commits >= int(text or 0)


def take_flag(path: str) -> bool:
    """Remove the flag file; whether this process was the one that did."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def hang(commits: int) -> None:
    """The training thread sleeps for ever (its process lives, a thread beside it goes
    on, its ring's heartbeats still answer): a hung worker, for the driver to find."""

    def beside() -> None:
        while True:
            time.sleep(0.05)  # a thread that keeps running next to the hung one

    threading.Thread(target=beside, name="beside-the-hang", daemon=True).start()
    print(f"hanging after commit {commits} at {time.time():.3f}", flush=True)
    while True:
        time.sleep(3600)  # HANG HERE (tests find this line in the driver's log)


class RollbackCounter(logging.Handler):
    """Counts the steps ``@elastic.run`` abandoned: each time it restores the last commit
    because the round lost a worker or was superseded mid-step (its "rolling back" line;
    a restore at the end of training, when a round formed as the function returned, is
    no abandoned step and says otherwise)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "rolling back" in record.getMessage():
            self.count += 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--samples", type=int, default=1200)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument(
        "--work", type=int, default=30, help="size of a matrix product per step: simulated compute"
    )
    parser.add_argument(
        "--fail-host",
        help="with --fail-flag: a worker on this host exits 3 "
        "at start while the flag file exists (a broken host)",
    )
    parser.add_argument("--fail-flag")
    parser.add_argument(
        "--pause-while",
        help="before each step, wait while this file exists and the job has reached the "
        "commit count it holds (empty: 0): a test holds training at a known step without "
        "changing its result",
    )
    parser.add_argument(
        "--crash-flag",
        help="with --crash-at: exit 5 at that commit once, "
        "removing the flag (an ordinary crash, not a broken script)",
    )
    parser.add_argument("--crash-at", type=int, default=0)
    parser.add_argument(
        "--hang-flag",
        help="with --hang-at: rank --hang-rank's training thread sleeps for ever after that "
        "commit, once, removing the flag, while a thread beside it goes on (a hung worker)",
    )
    parser.add_argument("--hang-at", type=int, default=0)
    parser.add_argument("--hang-rank", type=int, default=1)
    parser.add_argument("--exit-slot", type=int, help="the worker on this slot exits 0 early")
    parser.add_argument("--exit-at", type=int, default=0, help="... after this many commits")
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=0.0,
        help="simulated compute per step, in seconds (a job that lasts, whatever the CPU)",
    )
    parser.add_argument(
        "--hold-after",
        help="once training returned and the result is written, wait while this file "
        "exists before exiting: a test catches a finished worker that has not exited",
    )
    args = parser.parse_args()
    if (
        args.fail_host
        and os.environ.get("ELASTIC_HOST") == args.fail_host
        and os.path.exists(args.fail_flag)
    ):
        print(f"simulated broken host {args.fail_host}", flush=True)
        return 3
    exit_early = args.exit_slot is not None and os.environ.get("ELASTIC_SLOT") == str(
        args.exit_slot
    )
    values = np.arange(args.samples, dtype=np.float64)
    work = np.full((args.work, args.work), 1.0 / args.work)

    rollbacks = RollbackCounter()
    loop_log = logging.getLogger("elastic.loop")
    loop_log.addHandler(rollbacks)
    loop_log.setLevel(logging.INFO)  # (a superseded round says so at INFO)

    elastic.init()
    state = elastic.NumpyState(
        visits=np.zeros(args.samples), total=np.zeros(1), epoch=0, batch=0, commits=0, sizes=[]
    )

    @elastic.run
    def train(state):
        sampler = elastic.ElasticSampler(args.samples, shuffle=True, seed=7)
        for state.epoch in range(state.epoch, args.epochs):  # noqa: B020  (the README loop)
            sampler.set_epoch(state.epoch)
            for idx in sampler.batches(batch_size=args.batch, start=state.batch):
                while args.pause_while and held(args.pause_while, state.commits):
                    time.sleep(0.01)  # simulated slow compute, held by the test
                np.linalg.matrix_power(work, 8)  # compute that does not touch the result
                if args.step_seconds:
                    time.sleep(args.step_seconds)  # simulated compute of a fixed length
                contribution = np.zeros(args.samples + 1)
                contribution[idx] = 1.0
                contribution[-1] = values[idx].sum()
                reduced = elastic.allreduce(contribution, op="sum")
                state.visits += reduced[:-1]
                state.total += reduced[-1]
                state.batch += 1
                state.commits += 1
                if not state.sizes or state.sizes[-1][0] != elastic.size():
                    state.sizes.append((elastic.size(), state.commits))
                state.commit()
                if args.crash_flag and state.commits >= args.crash_at and elastic.rank() == 0:
                    try:
                        os.unlink(args.crash_flag)
                    except FileNotFoundError:
                        pass
                    else:
                        print("crashing once with exit status 5", flush=True)
                        os._exit(5)
                if (
                    args.hang_flag
                    and state.commits >= args.hang_at
                    and elastic.rank() == args.hang_rank
                    and take_flag(args.hang_flag)
                ):
                    hang(state.commits)
                if exit_early and state.commits >= args.exit_at:
                    print("leaving early with exit status 0", flush=True)
                    os._exit(0)
                if elastic.rank() == 0 and state.commits % PROGRESS_EVERY == 0:
                    print(f"progress {state.commits}", flush=True)
            state.batch = 0

    train(state)
    result = {
        "rank": elastic.rank(),
        "size": elastic.size(),
        "commits": state.commits,
        "epoch": state.epoch,
        "total": float(state.total[0]),
        "visits_min": float(state.visits.min()),
        "visits_max": float(state.visits.max()),
        "visits_sum": float(state.visits.sum()),
        "sizes": state.sizes,
        "rollbacks": rollbacks.count,
        "digest": float((state.visits * np.arange(1, args.samples + 1)).sum()),
    }
    worker = os.environ.get("ELASTIC_WORKER_ID", f"rank{elastic.rank()}")
    with open(os.path.join(args.out_dir, f"{worker}.json"), "w") as f:
        json.dump(result, f)
    while args.hold_after and os.path.exists(args.hold_after):
        # Polls the gate as the pause loop above does: the test holds a finished worker
        # alive until it removes the file (no deadline: the job's end stops the worker).
        time.sleep(0.01)
    elastic.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
