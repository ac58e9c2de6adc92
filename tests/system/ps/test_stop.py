"""A stopped ps job loses no applied step: the job's end, or SIGTERM (what a scheduler
sends to preempt) or SIGINT to ``elastic-run`` in the middle of training, makes the
shards write a final coordinated checkpoint of the step they reached, says so in the
event log, and a new job on the same checkpoint directory resumes at exactly that step. The checkpoint interval
is long (60 s), so no periodic checkpoint happens during the run: only the final one
can hold the progress."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from ps.client import PSClient
from ps.settings import ClientSettings
from ps.shard import checkpoint as ck
from tests.ps.test_failures import _shard_alone, check_gd, full_data_sync_workers
from tests.support.jobs import WORKLOADS, ElasticRun, wait_until
from tests.support.ps.harness import PSJob

PS_LINEAR = WORKLOADS / "ps_linear.py"


def _acked(out: Path) -> int:
    """The highest step any worker saw applied (``ps_linear.py --record-steps``)."""
    steps = [int(line) for p in out.glob("*.steps") for line in p.read_text().split()]
    return max(steps, default=0)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "mode, stop",
    [
        ("sync", "SIGTERM"),
        # Both modes stop and end by the same route (the shards' final checkpoint); CI
        # runs one mode of each, the long runs the rest (the suite's 15 minutes).
        pytest.param("async", "SIGTERM", marks=pytest.mark.long),
        # SIGINT takes SIGTERM's route (rendezvous.signals): in the long runs only
        pytest.param("sync", "SIGINT", marks=pytest.mark.long),
        pytest.param("sync", "end", marks=pytest.mark.long),
        ("async", "end"),
    ],
)
def test_a_stopped_job_resumes_at_the_step_it_reached(tmp_path, mode, stop):
    """``stop``: a signal to ``elastic-run`` mid-run, or the job's own end (step 150)."""
    ckpt = tmp_path / "ckpt"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()

    def args(out: Path, steps: int) -> list[str]:
        return [
            *("-np", "2", "--num-ps", "2", "--ps-mode", mode),
            *("--ps-checkpoint-dir", str(ckpt), "--ps-checkpoint-interval", "60"),
            *("python", str(PS_LINEAR), str(out), "--steps", str(steps), "--record-steps"),
        ]

    with ElasticRun(args(first, 150 if stop == "end" else 100_000), tmp_path / "run1") as run:
        if stop == "end":
            assert run.wait(timeout=100) == 0, run.stderr_tail()
        else:
            wait_until(lambda: _acked(first) >= 120, 90, f"step 120; {run.stderr_tail()}")
            os.kill(run.proc.pid, getattr(signal, stop))
            run.wait(timeout=60)
        checkpoints = run.events("checkpoint_written")
    acked = _acked(first)
    assert [e["final"] for e in checkpoints] == [True], checkpoints
    reached = checkpoints[0]["step"]
    # Every step a worker saw applied is in the checkpoint; in sync mode it holds at
    # most the one step whose replies the stop cut off.
    assert reached >= acked, (reached, acked)
    if mode == "sync":
        assert reached <= acked + 1, (reached, acked)
    if stop == "end":
        assert reached >= 150 and (mode == "async" or reached == 150), reached
    with ElasticRun(args(second, reached + 20), tmp_path / "run2") as run:
        assert run.wait(timeout=100) == 0, run.stderr_tail()
    results = [json.loads(p.read_text()) for p in second.glob("*.json")]
    assert results and all(r["first_step"] == reached for r in results), (reached, results)
    assert all(r["step"] >= reached + 20 for r in results)


def test_a_shard_alone_checkpoints_what_it_has_on_sigterm(tmp_path):
    """A shard run without a driver or a store (one shard: it coordinates itself)
    writes a checkpoint of its state when SIGTERM stops it."""
    ckpt = str(tmp_path / "ckpt")
    proc, port = _shard_alone(tmp_path, "--checkpoint-dir", ckpt, "--checkpoint-interval", "3600")
    client = PSClient([f"127.0.0.1:{port}"], "s", ClientSettings(retry_deadline=30))
    try:
        client.init({"w": np.zeros(3)}, optimizer="sgd", lr=1.0)
        for _ in range(5):
            client.push({"w": np.ones(3)})
        assert ck.load_newest(ckpt) is None  # the interval is an hour
    finally:
        client.close()
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    loaded = ck.load_newest(ckpt)
    assert loaded is not None and loaded.step == 5
    np.testing.assert_array_equal(loaded.shard_snapshot(0, 1, 1 << 20).variables["w"].param, -5)


@pytest.mark.timeout(120)
def test_a_shard_stopped_alone_asks_shard_0_for_a_checkpoint(embedded_server, tmp_path):
    """SIGTERM to shard 1 alone (no driver stop) mid-run in sync mode: a single shard
    cannot make a coordinated checkpoint, so it asks shard 0, which seals every shard
    in one; shard 1 stops with its state in it, and once restarted (as the driver does)
    the workers end exactly where plain gradient descent does."""
    steps, lr = 300, 0.05
    ckpt = str(tmp_path / "ckpt")
    with PSJob(
        embedded_server, tmp_path, 2, "sync", checkpoint_dir=ckpt, checkpoint_interval=3600
    ).start() as job:
        outs = full_data_sync_workers(job, tmp_path, steps, lr)
        wait_until(lambda: job.shard_status(0)["step"] >= 30, 60, "step 30")
        job.shards[1].proc.terminate()
        assert job.shards[1].reap(30) == 0
        (record,) = job.checkpoints()
        assert 30 <= record["step"] < steps and not record["final"]
        assert f"stopping with its state in checkpoint {record['checkpoint_id']}" in (
            job.shard_log(1)
        )
        job.restart_shard(1)
        job.wait_workers(timeout=90)
    check_gd(outs, steps, lr)
