"""Horovod's elastic PyTorch examples, as users write them with ``import elastic.horovod
as hvd`` (``examples/horovod/``), under ``elastic-run`` with chaos kills: each job must
finish every epoch or iteration, exit 0, and leave its workers with identical weights.

The world is fixed (``-np 2``): a killed worker's replacement joins the survivor, which
waits for it, so the last round always has two workers whose weights can differ. The
replacement runs the script from its top, ``hvd.init()`` first, as Horovod's examples
do. A kill lands at the chaos's first tick after a round forms, within 1.5 times
``--chaos-kill-interval`` (1 s and 0.5 s here): mid-training on an idle machine, rolling
back to the last commit, and while the workers still set up or sync on a loaded one
(recovery is the same). The training lasts about twice that on this machine when idle,
so the first kill lands before it ends; a second one when the training left after the
first recovery is long enough.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.jobs import ROOT, ElasticRun

pytestmark = pytest.mark.chaos

EXAMPLES = ROOT / "examples" / "horovod"
KILLS = 2


def records(record_dir: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(record_dir.glob("rank-*.json"))]
    return sorted(found, key=lambda r: r["rank"])


def run_example(tmp_path: Path, interval: float, script: str, *args: str) -> list[dict]:
    """Run ``script`` under chaos (a kill about every ``interval`` seconds) to its end;
    what each worker of the last round recorded. Raises AssertionError unless the job
    exits 0 after one to ``KILLS`` chaos kills."""
    record = tmp_path / "record"
    record.mkdir()
    chaos = ["-np", "2", "--chaos-kill-interval", str(interval), "--chaos-max-kills", str(KILLS)]
    command = ["python", str(EXAMPLES / script), "--record", str(record), *args]
    with ElasticRun([*chaos, *command], tmp_path) as run:
        assert run.wait(timeout=100) == 0, run.stderr_tail()
        kills = run.events("chaos_kill")
        failed = {e["worker"] for e in run.events("worker_failed")}
        rounds = run.events("round_formed")
    assert 1 <= len(kills) <= KILLS
    assert {k["worker"] for k in kills} <= failed
    assert len(rounds) == len(kills) + 1 and {r["size"] for r in rounds} == {2}
    found = records(record)
    assert [r["rank"] for r in found] == [0, 1], found  # the last round's two workers
    assert len({r["digest"] for r in found}) == 1, found  # identical weights
    return found


@pytest.mark.timeout(120)
def test_mnist_shaped_example_survives_chaos_kills(tmp_path):
    epochs = 10
    found = run_example(tmp_path, 1.0, "pytorch_mnist_elastic.py", "--epochs", str(epochs))
    for r in found:
        assert r["epoch"] == epochs and r["size"] == 2
        assert r["accuracy"] > 0.5  # it learned (chance is 0.1)


@pytest.mark.timeout(120)
@pytest.mark.long  # (the MNIST-shaped example runs under chaos in CI)
def test_synthetic_benchmark_shaped_example_survives_chaos_kills(tmp_path):
    iters = 15
    found = run_example(
        tmp_path,
        0.5,
        "pytorch_synthetic_benchmark_elastic.py",
        "--batch-size",
        "16",
        "--num-warmup-batches",
        "5",
        "--num-batches-per-iter",
        "10",
        "--num-iters",
        str(iters),
        "--num-batches-per-commit",
        "5",  # a kill loses up to 4 steps, redone from the commit
        "--fp16-allreduce",
    )
    for r in found:
        assert r["iters"] == iters and r["size"] == 2
