"""A deterministic model for the global-batch tests: linear least squares in float64.

The data, the gradient and the one-process reference training live here, so that the
workers (``workloads/global_batch.py``) and the tests that check them use one
definition. Plain SGD on a quadratic contracts errors, so a distributed run that takes
the same steps on the same samples ends within rounding of the one-process run, and a
step taken on other samples, or weighted otherwise, shows.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import elastic
from elastic.sampler import epoch_order
from elastic.state import State

#: the epoch order's seed in the workload and in the reference
SAMPLER_SEED = 3


@dataclass(frozen=True)
class Problem:
    samples: int = 302
    features: int = 6
    lr: float = 0.1
    seed: int = 5

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        """(x, y): standard normal features, and targets of a fixed linear model plus noise."""
        rng = np.random.default_rng(self.seed)
        x = rng.normal(size=(self.samples, self.features))
        y = x @ rng.normal(size=self.features) + 0.1 * rng.normal(size=self.samples)
        return x, y


def gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The gradient of the mean of ``(x @ w - y)**2 / 2`` over the rows of ``x``: NaN
    for no row (a mean over nothing), as a user's gradient function would give."""
    with np.errstate(invalid="ignore"):
        return x.T @ (x @ w - y) / len(x)


def one_process(problem: Problem, epochs: int, step_samples: int) -> np.ndarray:
    """The weights after ``epochs`` epochs of SGD in one process, each step the mean
    gradient over the next ``step_samples`` samples of the epoch order (the last step of
    an epoch over what is left)."""
    x, y = problem.data()
    w = np.zeros(problem.features)
    for epoch in range(epochs):
        order = epoch_order(problem.samples, epoch, True, SAMPLER_SEED)
        for lo in range(0, problem.samples, step_samples):
            rows = order[lo : lo + step_samples]
            w -= problem.lr * gradient(w, x[rows], y[rows])
    return w


#: how long a paused worker waits at most before it gives up (the test failed)
PAUSE_LIMIT = 120.0


def wait_while_paused(pause: Path | None, state: State) -> None:
    """Before a step: while the test holds the file ``pause``, wait, and re-form when a
    round is pending (``HostsUpdatedInterrupt``), so that a replacement slow to start
    (importing torch) joins before the training ends. Raises TimeoutError after
    PAUSE_LIMIT."""
    if pause is None:
        return
    deadline = time.monotonic() + PAUSE_LIMIT
    while pause.exists():
        state.check_host_updates()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{pause} still there after {PAUSE_LIMIT:.0f}s")
        time.sleep(0.01)


def write_result(out_dir: str, state: State, w: list[float], **extra: object) -> None:
    """What a worker of the global-batch workloads ends with, in ``OUT_DIR/<worker>.json``
    for the test to compare: its world, its steps, its weights ``w`` and the visits."""
    worker = os.environ.get("ELASTIC_WORKER_ID", f"rank{elastic.rank()}")
    result = {
        "rank": elastic.rank(),
        "size": elastic.size(),
        "steps": state.steps,
        "sizes": state.sizes,
        "w": w,
        **extra,
        "visits_min": float(state.visits.min()),
        "visits_max": float(state.visits.max()),
    }
    with open(os.path.join(out_dir, f"{worker}.json"), "w") as f:
        json.dump(result, f)
