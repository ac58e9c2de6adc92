"""Shards with a backup (``--ps-replicas 1``) under the driver's own supervisor, with real
processes and real SIGKILL: a killed shard fails over to its backup at once, no step
goes back and no shard rolls back (sync and async), training ends with exactly the
expected result, and a killed backup is replaced. Without replicas, a restart from an
older state than the shards had reached is reported with the steps lost."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from ps.client import connect
from tests.ps.test_failures import _result, check_gd, full_data_sync_workers
from tests.support.jobs import wait_until
from tests.support.ps.supervised import SupervisedJob


def _steps(path: Path) -> list[int]:
    """The steps a worker's pushes returned (``--steps-file``), in order."""
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _reached(files: list[Path], step: int) -> bool:
    return all(len(_steps(f)) and _steps(f)[-1] >= step for f in files)


@pytest.mark.timeout(120)
def test_killed_sync_shards_fail_over_with_no_step_back_and_exact_training(
    embedded_server, tmp_path
):
    """Shard 1's primary killed while the workers push, then shard 0's (the checkpoint
    coordinator): each backup serves at once, a new backup copies it, no shard rolls
    back (their generation is the start's), every worker sees the steps 1..300 once and
    in order, and the result is plain gradient descent's, to the last bits."""
    steps, lr = 300, 0.05
    hold = tmp_path / "hold"
    hold.write_text("")
    files = [tmp_path / f"steps{r}" for r in range(2)]
    ckpt = str(tmp_path / "ckpt")
    with SupervisedJob(
        embedded_server, tmp_path, 2, "sync", checkpoint_dir=ckpt, checkpoint_interval=0.2
    ) as sj:
        outs = full_data_sync_workers(
            sj.job,
            tmp_path,
            steps,
            lr,
            *("--steps-file", tmp_path / "steps{rank}", "--hold", hold, "--hold-after", 150),
        )
        wait_until(lambda: _reached(files, 30), 60, "step 30")
        os.kill(sj.primary_pid(1), signal.SIGKILL)  # pushes in flight
        failed = sj.events.wait("ps_failed_over", 1)
        sj.events.wait("ps_backup_ready", 1, count=2)  # its new backup holds the state
        os.kill(sj.primary_pid(0), signal.SIGKILL)
        sj.events.wait("ps_failed_over", 0)
        sj.events.wait("ps_backup_ready", 0, count=2)
        hold.unlink()
        sj.job.wait_workers(timeout=90)
        generations = [sj.describe(i)["generation"] for i in range(2)]
    check_gd(outs, steps, lr)
    assert [_steps(f) for f in files] == [list(range(1, steps + 1))] * 2
    assert generations == ["c0", "c0"]
    assert 30 <= failed.step <= 150 and failed.from_address != failed.to_address
    assert not sj.events.of("ps_restarted") and not sj.events.of("ps_rolled_back")
    assert not sj.fatal


@pytest.mark.timeout(120)
def test_a_killed_backup_is_replaced_and_an_async_shard_fails_over_to_the_new_one(
    embedded_server, tmp_path
):
    """Async: shard 1's backup killed (a new one copies the shard), then shard 1's
    primary (the new backup takes over): every push of the two workers is applied
    exactly once (the weights are minus the number of pushes acknowledged), and no
    worker ever sees its step go back. The promoted backup is another incarnation than
    the primary it replaces: a call made to the primary is no call to it."""
    hold = tmp_path / "hold"
    hold.write_text("")
    files = [tmp_path / f"steps{r}" for r in range(2)]
    outs = [tmp_path / f"out{r}.json" for r in range(2)]
    with SupervisedJob(embedded_server, tmp_path, 2, "async") as sj:
        for r in range(2):
            sj.job.worker(
                *("count", "--steps", 600, "--out", outs[r], "--steps-file", files[r]),
                *("--hold", hold, "--hold-after", 300),
            )
        wait_until(lambda: _reached(files, 30), 60, "step 30")
        first_backup = sj.backup_pid(1)
        os.kill(first_backup, signal.SIGKILL)
        sj.events.wait("ps_backup_exited", 1)
        replaced = sj.events.wait("ps_backup_ready", 1, count=2)
        primary = sj.record(1)
        os.kill(sj.primary_pid(1), signal.SIGKILL)
        failed = sj.events.wait("ps_failed_over", 1)
        wait_until(lambda: sj.record(1).address == failed.to_address, 30, "the promoted record")
        promoted = sj.record(1)
        assert promoted.incarnation and primary.incarnation != promoted.incarnation
        sj.events.wait("ps_backup_ready", 1, count=3)
        hold.unlink()
        sj.job.wait_workers(timeout=90)
        client = connect(environ=sj.job.env())
        try:
            final = client.pull()
            step = client.step
        finally:
            client.close()
    acked = sum(_result(out)["acked"] for out in outs)
    assert step == acked >= 600
    np.testing.assert_array_equal(final["w"], np.full((64, 8), -float(acked)))
    np.testing.assert_array_equal(final["c"], np.full(3, -float(acked)))
    for f in files:
        seen = _steps(f)
        assert seen and all(b > a for a, b in zip(seen, seen[1:])), seen
    assert replaced.pid != first_backup and failed.to_address == replaced.address
    assert not sj.events.of("ps_restarted") and not sj.events.of("ps_rolled_back")
    assert not sj.fatal


@pytest.mark.timeout(120)
def test_without_replicas_a_restart_that_goes_back_reports_the_steps_lost(
    embedded_server, tmp_path
):
    """Sync, no backup, no checkpoint: the workers held at step 40, shard 1 killed; the
    supervisor restarts it, every shard goes back to the empty start, and
    ``ps_rolled_back`` says so in one line with the 40 steps lost. Training then
    redoes them and still ends at plain gradient descent's result."""
    steps, lr = 100, 0.05
    hold = tmp_path / "hold"
    hold.write_text("")
    files = [tmp_path / f"steps{r}" for r in range(2)]
    with SupervisedJob(embedded_server, tmp_path, 2, "sync", replicas=0) as sj:
        outs = full_data_sync_workers(
            sj.job,
            tmp_path,
            steps,
            lr,
            *("--steps-file", tmp_path / "steps{rank}", "--hold", hold, "--hold-after", 40),
        )
        wait_until(lambda: _reached(files, 40), 60, "step 40")
        os.kill(sj.primary_pid(1), signal.SIGKILL)
        rolled = sj.events.wait("ps_rolled_back", 1)
        hold.unlink()
        sj.job.wait_workers(timeout=90)
    check_gd(outs, steps, lr)
    assert [e.shard for e in sj.events.of("ps_restarted")] == [1]
    assert (rolled.from_step, rolled.to_step, rolled.lost_steps, rolled.checkpoint) == (
        40,
        0,
        40,
        None,
    )
    assert str(rolled) == (
        "ps shard 1 restarted from the empty start at step 0, behind the step 40 the "
        "shards had reached: 40 steps lost"
    )
    assert not sj.events.of("ps_failed_over") and not sj.fatal
