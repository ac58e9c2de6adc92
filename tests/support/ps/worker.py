"""Worker processes for the parameter-server tests (run as a script; the test module
imports the problem definitions to compute expected numbers).

    python tests/support/ps/worker.py lsq --steps N [--rank R --size S] [--data shard|full] ...
    python tests/support/ps/worker.py count --steps N --progress FILE

Connects with ``elastic.ps.connect()`` from the environment a driver would give. With
``--steps-file FILE`` each push appends the step it returned to FILE; with ``--hold FILE
--hold-after N`` a worker past step N waits before its next push while FILE exists (a
test holds training there, however fast it runs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# The repository's root (run as a file, this script's own folder is sys.path[0]).
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402


def make_problem(seed: int = 0, rows: int = 96, dim: int = 16, out: int = 4):
    """A least-squares problem: ``y = X @ w_true + b_true + noise``."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, dim))
    w_true, b_true = rng.normal(size=(dim, out)), rng.normal(size=out)
    y = X @ w_true + b_true + 0.01 * rng.normal(size=(rows, out))
    return X, y


def initial_params(dim: int = 16, out: int = 4) -> dict:
    return {"w": np.zeros((dim, out)), "b": np.zeros(out)}


def data_of(X, y, rank: int, size: int, mode: str):
    return (X, y) if mode == "full" else (X[rank::size], y[rank::size])


def grad(params: dict, X, y) -> dict:
    r = X @ params["w"] + params["b"] - y
    return {"w": X.T @ r / len(X), "b": r.mean(axis=0)}


def loss(params: dict, X, y) -> float:
    r = X @ params["w"] + params["b"] - y
    return float(np.mean(r * r))


def _progress(path: str | None, value: int) -> None:
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{value}\n".encode())
        finally:
            os.close(fd)


def _pushed(args, client) -> None:
    """After each push: the step it returned, then the hold (see the module doc)."""
    _progress(args.steps_file, client.step)
    while args.hold and client.step >= args.hold_after and os.path.exists(args.hold):
        time.sleep(0.01)  # simulated slow compute, held by the test


def run_lsq(args, client) -> dict:
    from ps.errors import PSRoundChangedError

    X, y = make_problem()
    Xr, yr = data_of(X, y, args.rank, args.size, args.data)
    if args.size > 1 and not os.environ.get("ELASTIC_WORKER_ID"):
        client.set_round(0, args.size, args.rank)
    client.init(initial_params(), optimizer=args.optimizer, lr=args.lr)
    pushes = changes = 0
    while True:
        try:
            params = client.pull()
            if client.step >= args.steps:
                break
            client.push(grad(params, Xr, yr))
            pushes += 1
            _progress(args.progress, client.step)
            _pushed(args, client)
        except PSRoundChangedError:
            changes += 1  # the round changed under a sync step: pull and redo it
    return {
        "step": client.step,
        "pushes": pushes,
        "round_changes": changes,
        "loss": loss(params, X, y),
        "w": params["w"].tolist(),
        "b": params["b"].tolist(),
    }


def run_count(args, client) -> dict:
    client.init({"w": np.zeros((64, 8)), "c": np.zeros(3)}, optimizer="sgd", lr=1.0)
    ones = {"w": np.ones((64, 8)), "c": np.ones(3)}
    acked = 0
    while client.step < args.steps:
        client.push(ones)
        acked += 1
        _progress(args.progress, acked)
        _pushed(args, client)
    return {"acked": acked, "step": client.step}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("task", choices=("lsq", "count"))
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--size", type=int, default=1)
    p.add_argument("--data", choices=("shard", "full"), default="shard")
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--progress", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--steps-file", default=None)
    p.add_argument("--hold", default=None)
    p.add_argument("--hold-after", type=int, default=0)
    args = p.parse_args(argv)
    import elastic  # a plain import must be enough for elastic.ps.connect()

    client = elastic.ps.connect()
    try:
        result = (run_lsq if args.task == "lsq" else run_count)(args, client)
    finally:
        client.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
