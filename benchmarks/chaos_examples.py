"""The README's examples under the README's chaos flag, run after run: the job must end 0,
exact, every time.

Each run is ``elastic-run -np 3 --min-np 2 --chaos-kill-interval SEC --chaos-max-kills 20
python examples/EXAMPLE`` (SEC cycling through ``--intervals``), bounded by ``--timeout``
(a run past it is a hang: the process group is killed). A run is exact when it exits 0
and the driver's ``job done`` line and rank 0's ``done:`` line both name the example's
full step count (every step taken once, none lost). With ``--burners N``, N CPU-bound
processes spin beside the runs (the load of CI's shared 2 cores). Prints one JSON line
per run and one per example with the counts (ok, failed, hung), then exits 1 if any run
was not ok.

Usage: python -m benchmarks.chaos_examples [--runs 20] [--intervals 1,2,3] [--burners 2]
       [--examples train_digits.py,train_torch_digits.py] [--timeout 240]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness.paths import ROOT

DONE = re.compile(r"job done in round \d+ at step (\d+)")
RANK0_DONE = re.compile(r"^\[0\] done: (\d+) steps", re.M)


def burn() -> None:
    while True:
        pass


def run_once(example: str, interval: float, timeout: float, log_dir: Path, n: int) -> dict:
    command = [
        "elastic-run",
        "-np",
        "3",
        "--min-np",
        "2",
        "--chaos-kill-interval",
        f"{interval:g}",
        "--chaos-max-kills",
        "20",
        "python",
        str(ROOT / "examples" / example),
    ]
    log = log_dir / f"{Path(example).stem}-{n}.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    text = log.read_text(errors="replace")
    done, rank0 = DONE.search(text), RANK0_DONE.search(text)
    steps = int(done.group(1)) if done else None
    kills = text.count("chaos: killed")
    return {
        "example": example,
        "run": n,
        "interval": interval,
        "code": code,
        "hung": code is None,
        "steps": steps,
        "rank0_steps": int(rank0.group(1)) if rank0 else None,
        "kills": kills,
        "seconds": round(time.monotonic() - started, 1),
        "log": str(log),
        "last": [ln for ln in text.splitlines() if ln.startswith("elastic-run")][-1:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--intervals", default="1,2,3")
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--examples", default="train_digits.py,train_torch_digits.py")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args()
    intervals = [float(x) for x in args.intervals.split(",")]
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="chaos-examples-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burners)]
    for b in burners:
        b.start()
    bad = 0
    try:
        for example in args.examples.split(","):
            results = []
            for n in range(args.runs):
                r = run_once(example, intervals[n % len(intervals)], args.timeout, log_dir, n)
                # Exact: the driver's last step and rank 0's agree, and every run the same.
                r["ok"] = (
                    r["code"] == 0 and r["steps"] is not None and r["steps"] == r["rank0_steps"]
                )
                results.append(r)
                print(json.dumps(r), flush=True)
            counts = {r["steps"] for r in results if r["ok"]}
            ok = sum(r["ok"] for r in results)
            if len(counts) > 1:  # exact runs all end at the same full step count
                ok = 0
            summary = {
                "example": example,
                "runs": len(results),
                "ok": ok,
                "failed": sum(1 for r in results if not r["ok"] and not r["hung"]),
                "hung": sum(r["hung"] for r in results),
                "steps": sorted(counts),
                "kills": sum(r["kills"] for r in results),
                "burners": args.burners,
                "median_seconds": sorted(r["seconds"] for r in results)[len(results) // 2],
            }
            print(json.dumps(summary), flush=True)
            bad += len(results) - ok
    finally:
        for b in burners:
            b.terminate()
        for b in burners:
            b.join(timeout=5)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
