"""Elastic training of a small numpy MLP on the handwritten digits (8x8 images, 10 classes).

    elastic-run -np 2 python examples/train_digits.py          # on this machine
    elastic-run --min-np 1 --max-np 4 -np 2 --chaos-kill-interval 3 python examples/train_digits.py

Workers may die or join at any time: ``@elastic.run`` rolls back to the last commit and
re-forms, rank 0 of the new round brings everyone to the newest committed state, and
``ElasticSampler`` makes sure every training image of an epoch is used once. Every step
takes the same global batch whatever the world size, and ``elastic.weighted_average``
combines the workers' mean gradients by their sample counts, so each update is the one a
single process makes on those images. Reaches about
97% test accuracy (at least 95% is checked at the end: exit status 1 below that).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import elastic

DATA = Path(__file__).resolve().parent / "data" / "digits.csv.gz"
TARGET_ACCURACY = 0.95


def load_digits():
    """(train_x, train_y, test_x, test_y): a fixed 80/20 split, pixels scaled to [0, 1]."""
    with gzip.open(DATA, "rt") as f:
        raw = np.loadtxt(f, delimiter=",", dtype=np.float64)
    x, y = raw[:, :-1] / 16.0, raw[:, -1].astype(np.int64)
    order = np.random.default_rng(1234).permutation(len(x))
    x, y = x[order], y[order]
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def init_params(hidden: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.normal(0, np.sqrt(2 / 64), (64, hidden)),
        "b1": np.zeros(hidden),
        "w2": rng.normal(0, np.sqrt(2 / hidden), (hidden, 10)),
        "b2": np.zeros(10),
    }


def forward(p, x):
    h = np.maximum(x @ p["w1"] + p["b1"], 0.0)
    logits = h @ p["w2"] + p["b2"]
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    return h, probs


def gradients(p, x, y) -> dict:
    """Gradients of the mean cross-entropy over the rows of ``x`` (zeros for no row: an
    empty share, whose weight in ``weighted_average`` is 0 anyway)."""
    if len(x) == 0:
        return {k: np.zeros_like(v) for k, v in p.items()}
    h, probs = forward(p, x)
    d_logits = probs
    d_logits[np.arange(len(y)), y] -= 1.0
    d_h = (d_logits @ p["w2"].T) * (h > 0)
    grads = {"w2": h.T @ d_logits, "b2": d_logits.sum(0), "w1": x.T @ d_h, "b1": d_h.sum(0)}
    return {k: g / len(x) for k, g in grads.items()}


def accuracy(p, x, y) -> float:
    return float((forward(p, x)[1].argmax(axis=1) == y).mean())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument(
        "--global-batch", type=int, default=32, help="images per step, across the world"
    )
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()

    train_x, train_y, test_x, test_y = load_digits()
    elastic.init()
    # Attributes come from the keyword arguments, which a type checker cannot see: Any.
    state: Any = elastic.NumpyState(**init_params(args.hidden), epoch=0, batch=0, steps=0)
    names = ["w1", "b1", "w2", "b2"]

    def report_world():
        if elastic.rank() == 0:
            print(
                f"world re-formed: {elastic.size()} workers, resuming at epoch {state.epoch} "
                f"batch {state.batch}",
                flush=True,
            )

    state.register_reset_callbacks([report_world])

    @elastic.run
    def train(state):
        sampler = elastic.ElasticSampler(
            len(train_x), shuffle=True, seed=0, global_batch_size=args.global_batch
        )
        for state.epoch in range(state.epoch, args.epochs):  # noqa: B020 - resumes the epoch
            sampler.set_epoch(state.epoch)
            started, seen = time.perf_counter(), 0
            for idx in sampler.batches(start=state.batch):  # this worker's share of the step
                params = {k: getattr(state, k) for k in names}
                grads = gradients(params, train_x[idx], train_y[idx])  # means over the share
                # The means over the step's images, weighted by each share's size: one
                # allreduce for every gradient.
                for k, g in elastic.weighted_average(grads, len(idx)).items():
                    getattr(state, k)[...] -= args.lr * g
                seen += args.global_batch
                state.batch += 1
                state.steps += 1
                state.commit()
            state.batch = 0
            if elastic.rank() == 0:
                elapsed = time.perf_counter() - started
                acc = accuracy({k: getattr(state, k) for k in names}, test_x, test_y)
                print(
                    f"epoch {state.epoch + 1}/{args.epochs}: world size {elastic.size()}, "
                    f"{seen / max(elapsed, 1e-9):.0f} samples/s, test accuracy {acc:.3f}",
                    flush=True,
                )

    train(state)
    final = accuracy({k: getattr(state, k) for k in names}, test_x, test_y)
    if elastic.rank() == 0:
        print(
            f"done: {state.steps} steps, test accuracy {final:.3f} (target {TARGET_ACCURACY:.2f})",
            flush=True,
        )
    elastic.shutdown()
    return 0 if final >= TARGET_ACCURACY else 1


if __name__ == "__main__":
    sys.exit(main())
