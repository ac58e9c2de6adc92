"""Nothing trained is lost: whole jobs with ``--checkpoint-dir`` killed at once, stopped
and started again (the same command), and what a job says when nothing holds its state.

The numpy workload's result is exact (``workloads/exact_sum.py``): every sample counted
once per epoch whatever happened, or the job is wrong; the torch one
(``workloads/global_batch_torch.py``) ends with the weights of one process on the same
samples.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess

import numpy as np
import pytest

from elastic.snapshots import files
from elastic.snapshots.parts import cut
from tests.support.jobs import (
    ElasticRun,
    check_exact_sum,
    exact_sum_command,
    wait_until,
    write_whole,
)
from tests.support.linear_model import Problem, one_process
from tests.support.paths import WORKLOADS

SAMPLES, EPOCHS = 960, 2  # 240 commits per worker: the kill (past 60) and the hold (100) mid-run
SLOW = ("--work", "160")  # a few ms of compute per step: snapshots are many steps apart
INTERVAL = "0.5"


def snapshot_args(ckpt, out, *extra: str) -> list[str]:
    return [
        *("-np", "2", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", INTERVAL),
        *exact_sum_command(out, SAMPLES, EPOCHS, *SLOW, *extra),
    ]


def kill_everything(run: ElasticRun) -> None:
    """SIGKILL the driver and every worker at once (a power cut, a preemption)."""
    assert run.proc is not None
    for pid in (run.proc.pid, *run.worker_pids().values()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    run.proc.wait(timeout=10)


@pytest.mark.timeout(120)
def test_a_job_killed_whole_resumes_from_its_newest_snapshot(tmp_path):
    """The whole process tree SIGKILLed at once mid-run, then the same command again: it
    resumes from the newest complete snapshot, losing at most one interval of steps and
    the snapshot's write (the README's promise), and finishes exact (each sample once
    per epoch)."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    with ElasticRun(snapshot_args(ckpt, out), tmp_path / "run1") as run:
        run.wait_event("snapshot_written", lambda e: e["step"] >= 60, timeout=60)
        run.wait_event("snapshot_written", after=len(run.events("snapshot_written")), timeout=30)
        kill_everything(run)
        reached = run.progress  # rank 0's last "progress N" line (every 10 commits)
        written = [e["step"] for e in run.events("snapshot_written")]
    interval_steps = max(b - a for a, b in zip(written, written[1:]))
    with ElasticRun(snapshot_args(ckpt, out), tmp_path / "run2") as run:
        assert run.wait(timeout=90) == 0, run.stderr_tail()
        (resumed,) = run.events("snapshot_resumed")
    assert resumed["step"] >= written[-1]  # the newest complete (or one finished as it died)
    # The kill may come as the next snapshot is being written (it started an interval
    # after the newest one, whose event this test waited for): that one is lost too, and
    # a write takes less than an interval (snapshots do not overlap).
    lost = reached - resumed["step"]
    assert lost <= 2 * interval_steps + 10, (reached, resumed, written)
    check_exact_sum(out, SAMPLES, EPOCHS)


@pytest.mark.timeout(120)
def test_sigterm_writes_a_final_snapshot_and_the_restart_loses_no_step(tmp_path):
    """SIGTERM to elastic-run while training is held at commit 100: the final snapshot
    holds commit 100 exactly, the driver exits 143 (stopped, not failed) saying where,
    and the same command resumes at 100 and finishes exact."""
    ckpt, out, gate = tmp_path / "ckpt", tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    write_whole(gate, "100")
    with ElasticRun(snapshot_args(ckpt, out, "--pause-while", str(gate)), tmp_path / "run1") as run:
        wait_until(lambda: run.progress >= 100, 60, f"commit 100; {run.stderr_tail()}")
        assert run.proc is not None
        run.proc.send_signal(signal.SIGTERM)
        run.wait_event("stopping", timeout=20)
        gate.unlink()  # the held workers go on, see the final round, and write it
        assert run.wait(timeout=40) == 128 + signal.SIGTERM, run.stderr_tail()
        (stopped,) = run.events("job_stopped")
        assert stopped["step"] == 100 and stopped["path"], stopped
        assert "final snapshot of step 100" in stopped["reason"] and not run.events("job_failed")
        assert [e["final"] for e in run.events("snapshot_written")][-1:] == [True]
    with ElasticRun(snapshot_args(ckpt, out), tmp_path / "run2") as run:
        assert run.wait(timeout=90) == 0, run.stderr_tail()
        assert [e["step"] for e in run.events("snapshot_resumed")] == [100]
    check_exact_sum(out, SAMPLES, EPOCHS)


@pytest.mark.timeout(90)
def test_losing_every_holder_without_a_snapshot_fails_naming_the_step(tmp_path):
    """Every worker SIGKILLed with no --checkpoint-dir: the job does not start over
    silently from the initial state; it fails, naming the step lost and the way out."""
    out = tmp_path / "out"
    out.mkdir()
    with ElasticRun(["-np", "2", *exact_sum_command(out, SAMPLES, EPOCHS, *SLOW)], tmp_path) as run:
        wait_until(lambda: run.progress >= 30, 60, f"commit 30; {run.stderr_tail()}")
        for pid in run.worker_pids().values():
            os.kill(pid, signal.SIGKILL)
        assert run.wait(timeout=30) == 1, run.stderr_tail()
        (failed,) = run.events("job_failed")
    reason = failed["reason"]
    assert "state was lost" in reason and "--checkpoint-dir" in reason, reason
    assert "--on-state-lost restart" in reason and "step " in reason
    assert not run.events("round_formed")[1:], "no round of newcomers trained from scratch"


@pytest.mark.long  # resume from a snapshot runs in CI with numpy; torch's codec in tests/elastic
@pytest.mark.timeout(200)
def test_a_torch_job_killed_whole_resumes_with_the_weights_of_one_process(tmp_path):
    """TorchState (model, optimizer, ElasticSampler) through a whole-job SIGKILL and a
    restart: the weights are one process's on the same samples, each sample once per
    epoch."""
    epochs, batch = 12, 30
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    command = [
        *("python", str(WORKLOADS / "global_batch_torch.py"), str(out)),
        *("--global-batch", str(batch), "--max-micro", "8", "--epochs", str(epochs)),
        *("--step-time", "0.02"),
    ]
    args = ["-np", "2", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0.3", *command]
    with ElasticRun(args, tmp_path / "run1") as run:
        run.wait_event("snapshot_written", lambda e: e["step"] >= 30, timeout=120)
        kill_everything(run)
    with ElasticRun(args, tmp_path / "run2") as run:
        assert run.wait(timeout=150) == 0, run.stderr_tail()
        assert [e["step"] >= 30 for e in run.events("snapshot_resumed")] == [True]
    truth = one_process(Problem(), epochs, batch)
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert len(results) == 2
    for r in results:
        assert r["visits_min"] == r["visits_max"] == epochs, r
        assert float(np.abs(np.array(r["w"]) - truth).max()) <= 1e-12, r


@pytest.mark.timeout(120)
def test_a_full_disk_says_so_and_keeps_the_previous_snapshot_whole(tmp_path):
    """The checkpoint directory is a small tmpfs that holds one snapshot of the state
    and not two: the job trains on to an exact end, says that the later snapshots could
    not be written, and the first one stays whole (every checksum holds)."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    ckpt.mkdir(mode=0o700)
    out.mkdir()
    samples, epochs = 60_000, 20  # a state of 480 kB; steps of 6,000 samples
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=700k,mode=0700", "tmpfs", str(ckpt)], check=True
    )
    try:
        command = exact_sum_command(out, samples, epochs, "--batch", "3000", "--work", "200")
        args = ["-np", "2", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0.3", *command]
        with ElasticRun(args, tmp_path) as run:
            assert run.wait(timeout=100) == 0, run.stderr_tail()
            written, failed = run.events("snapshot_written"), run.events("snapshot_failed")
        assert written and failed, (written, failed)
        assert any("No space left on device" in e["error"] for e in failed), failed
        assert "is not usable" in run.stderr_tail(200)
        check_exact_sum(out, samples, epochs)
        (manifest, folder), *_ = files.complete(str(ckpt))
        assert manifest.step == written[-1]["step"]
        files.read(folder, manifest, cut)  # every file whole: raises otherwise
    finally:
        subprocess.run(["umount", "-l", str(ckpt)], check=False)
