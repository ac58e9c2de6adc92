"""Time from SIGKILL (or SIGSTOP) of a member to WorkerLostError on every survivor.

Real worker processes (``benchmarks/harness/comm/worker.py``) form a round, then one member, chosen
at random, is killed. ``busy``: every member loops on 256 KiB allreduces, and the time
is until each survivor's pending collective raises. ``idle``: members sit between
collectives, and the time is until each survivor's communicator is broken (its
on_peer_failure hook fires); its next call is then timed too (it must raise at once).
After each trial the survivors and one fresh worker form the next round on the same
listeners, as the elastic runtime does. ``sigstop`` stops a member instead, with
``peer_timeout`` = 2 s: detection is expected just after the timeout.

One JSON line per configuration:
    {"bench": "failure_detect", "signal", "mode", "transport", "world_size", "trials",
     "samples", "median_s", "p90_s", "max_s", "next_call_median_s", "load_avg"}

    python -m benchmarks.failure_detect_bench [--trials 10] [--worlds 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
from typing import Any

from benchmarks.harness.comm.workers import Workers


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def run_config(
    sig: str, mode: str, transport: str, world: int, trials: int, rng: random.Random
) -> dict:
    pool = Workers()
    samples, nexts = [], []
    settings: dict[str, Any] = {"transport": transport}
    if sig == "SIGSTOP":
        settings["peer_timeout"] = 2.0
    try:
        members = pool.spawn(world)
        for trial in range(trials):
            pool.form(members, round_id=trial + 1, **settings)
            if mode == "busy":
                for w in members:
                    w.send("loop", nbytes=256 * 1024)
                for w in members:
                    w.expect("looping")
            victim = rng.choice(members)
            survivors = [w for w in members if w is not victim]
            t0 = victim.signal(getattr(signal, sig))
            for w in survivors:
                if mode == "busy":
                    ev = w.expect("raised", timeout=60)
                    assert "WorkerLostError" in ev["mro"], ev
                    samples.append(ev["t"] - t0)
                    nexts.append(ev["next_s"])
                else:
                    ev = w.expect("peer_failure", timeout=60)
                    samples.append(ev["t"] - t0)
            if mode == "idle":
                for w in survivors:
                    w.send("allreduce")
                for w in survivors:
                    ev = w.expect("raised", timeout=30)
                    assert "WorkerLostError" in ev["mro"], ev
                    nexts.append(ev["wait_s"])
            if sig == "SIGSTOP":
                victim.signal(signal.SIGKILL)
            victim.reap()
            (fresh,) = pool.spawn(1)
            members = survivors + [fresh]
    finally:
        pool.reap()
    return {
        "bench": "failure_detect",
        "signal": sig,
        "mode": mode,
        "transport": transport,
        "world_size": world,
        "trials": trials,
        "samples": len(samples),
        "median_s": round(statistics.median(samples), 4),
        "p90_s": round(quantile(samples, 0.9), 4),
        "max_s": round(max(samples), 4),
        "next_call_median_s": round(statistics.median(nexts), 5),
        "load_avg": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--stop-trials", type=int, default=3)
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--transports", nargs="+", default=["tcp", "shm"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    for world in args.worlds:
        for transport in args.transports:
            for mode in ("busy", "idle"):
                print(
                    json.dumps(run_config("SIGKILL", mode, transport, world, args.trials, rng)),
                    flush=True,
                )
    if args.stop_trials:
        print(
            json.dumps(
                run_config("SIGSTOP", "busy", "tcp", max(args.worlds), args.stop_trials, rng)
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
