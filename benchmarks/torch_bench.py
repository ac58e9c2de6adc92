"""Training steps per second: ``elastic.torch.DistributedOptimizer`` (under elastic-run)
against PyTorch DDP on gloo, same model, same machine, interleaved in one invocation.

For each (model, world size) both groups of worker processes
(``workloads/torch_train.py``) are started and stay alive; they take turns running
blocks of training steps, so both see the same machine noise. A block's time is its
slowest rank's; steps/s is the median over blocks (after a warm-up block each). Ours
also reports the share of its gradient communication that ran before ``step()`` waited
for it (hidden behind backward), median over steps.

One JSON line per configuration:
    {"bench": "torch_train", "model", "params_m", "batch_per_worker", "world_size",
     "blocks", "steps_per_block", "steps_per_s": {"ours", "ddp_gloo"}, "ratio_ours_ddp",
     "hidden_share_ours", "load_avg"}

    python -m benchmarks.torch_bench [--models mlp cnn] [--worlds 2 4] [--blocks 5]
        [--steps 10] [--batches B ...]

Needs torch (``pip install torch==2.13.0``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from benchmarks.harness.torch_groups import Group, parameters_m

BATCH = {"mlp": (1, 2), "cnn": (8,)}  # per worker: small ones make communication matter


def measure(model: str, world: int, blocks: int, steps: int, batch: int) -> dict:
    groups = {impl: Group(impl, model, world, batch) for impl in ("ours", "ddp")}
    try:
        times: dict[str, list[float]] = {impl: [] for impl in groups}
        hidden: list[float] = []
        for block in range(blocks + 1):
            order = ("ours", "ddp") if block % 2 == 0 else ("ddp", "ours")
            for impl in order:
                seconds, shares = groups[impl].run(steps)
                if block > 0:  # block 0 warms up
                    times[impl].append(seconds)
                    if impl == "ours":
                        hidden.extend(shares)
    finally:
        for group in groups.values():
            group.close()
    rates = {impl: steps / statistics.median(ts) for impl, ts in times.items()}
    return {
        "bench": "torch_train",
        "model": model,
        "params_m": parameters_m(model),
        "batch_per_worker": batch,
        "world_size": world,
        "blocks": blocks,
        "steps_per_block": steps,
        "steps_per_s": {"ours": round(rates["ours"], 2), "ddp_gloo": round(rates["ddp"], 2)},
        "ratio_ours_ddp": round(rates["ours"] / rates["ddp"], 2),
        "hidden_share_ours": round(statistics.median(hidden), 2) if hidden else None,
        "load_avg": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=list(BATCH))
    parser.add_argument("--worlds", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--batches", nargs="+", type=int, help=f"per worker (default: per model, {BATCH})"
    )
    args = parser.parse_args()
    for model in args.models:
        for batch in args.batches or BATCH[model]:
            for world in args.worlds:
                print(json.dumps(measure(model, world, args.blocks, args.steps, batch)), flush=True)


if __name__ == "__main__":
    main()
