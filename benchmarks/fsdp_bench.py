"""Sharded models (``et.fully_shard``) on CPU/gloo: SIGKILL to the next committed step,
and step time against torch's plain FSDP2 under torchrun, on the same model and world,
the peers interleaved in one invocation (``tests/support/workloads/sharded_torch.py``).

Per run: ours under ``elastic-run -np W --min-np W-1``, rank 1 SIGKILLed in the middle
of step ``--kill-at`` (after its forward); recovery is the kill to the first commit
after it (the survivors' reshard included). Step time: the median gap between commits
before the kill, ours and plain FSDP2's (``torchrun --nproc-per-node W``).

One JSON line per configuration and run:
    {"bench": "fsdp", "world", "width", "blocks", "params_m", "run",
     "kill_to_commit_s", "step_s": {"ours", "fsdp2_torchrun"}, "overhead"}

    python -m benchmarks.fsdp_bench [--worlds 4] [--runs 3] [--width 256] [--blocks 4]

Not measured yet: torchrun with DCP as the peer of the recovery, torchft, memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "tests" / "support" / "workloads" / "sharded_torch.py"


def _times(path: Path) -> list[tuple[float, int]]:
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(float(t), int(s)) for t, s in rows]


def _median_gap(times: list[tuple[float, int]], upto: int) -> float:
    before = [t for t, s in times if s <= upto]
    gaps = [b - a for a, b in zip(before, before[1:])][1:]  # the first one warms up
    return statistics.median(gaps) if gaps else float("nan")


def _run(argv: list[str], cwd: Path) -> None:
    """Raises CalledProcessError (its output's tail on stderr) when ``argv`` fails."""
    proc = subprocess.run(argv, cwd=cwd, timeout=600, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise subprocess.CalledProcessError(proc.returncode, argv)


def _workload_args(out: Path, args: argparse.Namespace) -> list[str]:
    return [str(WORKLOAD), str(out), "--width", str(args.width), "--blocks", str(args.blocks)]


def ours(world: int, args: argparse.Namespace, work: Path) -> tuple[float, float]:
    out = work / "ours"
    out.mkdir()
    flag = out / "flag"
    flag.write_text("")
    argv = ["elastic-run", "-np", str(world), "--min-np", str(world - 1), sys.executable]
    argv += [*_workload_args(out, args), "--kill-flag", str(flag)]
    argv += ["--kill-at", str(args.kill_at), "--times", str(out / "times")]
    _run(argv, work)
    killed = float((out / "killed-at").read_text())
    times = _times(out / "times")
    recovered = min(t for t, _ in times if t > killed)
    return recovered - killed, _median_gap(times, args.kill_at - 1)


def plain(world: int, args: argparse.Namespace, work: Path) -> float:
    out = work / "plain"
    out.mkdir()
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world)]
    argv += [*_workload_args(out, args), "--torchrun", "--times", str(out / "times")]
    _run(argv, work)
    return _median_gap(_times(out / "times"), args.kill_at - 1)


def params_m(width: int, blocks: int) -> float:
    vocab = 32
    per_block = 2 * width + 2 * (width * 2 * width) + 2 * width + width
    return (vocab * width + blocks * per_block + width * vocab + vocab) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worlds", type=int, nargs="+", default=[4])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--kill-at", type=int, default=8)
    args = parser.parse_args()
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env_path}" if env_path else str(ROOT)
    for world in args.worlds:
        for run in range(args.runs):
            work = Path(tempfile.mkdtemp(prefix="fsdp-bench-"))
            try:
                # interleaved: the peers take turns, each run in the other order
                if run % 2 == 0:
                    kill_s, step_ours = ours(world, args, work)
                    step_plain = plain(world, args, work)
                else:
                    step_plain = plain(world, args, work)
                    kill_s, step_ours = ours(world, args, work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            line = {
                "bench": "fsdp",
                "world": world,
                "width": args.width,
                "blocks": args.blocks,
                "params_m": round(params_m(args.width, args.blocks), 3),
                "run": run,
                "kill_to_commit_s": round(kill_s, 3),
                "step_s": {"ours": round(step_ours, 4), "fsdp2_torchrun": round(step_plain, 4)},
                "overhead": round(step_ours / step_plain - 1, 3),
                "load_avg": round(os.getloadavg()[0], 2),
            }
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
