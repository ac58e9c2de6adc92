"""``elastic-run --ps-replicas 1``: every shard has a backup process that holds each
update before the shard acknowledges it; a shard SIGKILLed mid-run fails over to its
backup with no step lost and no rollback, and a new backup takes the old one's place."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.jobs import ElasticRun, wait_until
from tests.system.ps.test_jobs import PS_LINEAR, check_converged, shard_pid


def _steps(out: Path) -> dict[str, list[int]]:
    """The steps each worker saw applied (``ps_linear.py --record-steps``), in order."""
    return {p.stem: [int(s) for s in p.read_text().split()] for p in out.glob("*.steps")}


@pytest.mark.timeout(120)
def test_a_killed_shard_fails_over_to_its_backup_and_no_step_goes_back(tmp_path):
    """Sync, two workers, two shards with a backup each: shard 1's process SIGKILLed
    mid-run. elastic-run says so in one line each (the failover with its step, the new
    backup in step), restarts nothing and rolls nothing back; every worker sees the
    steps 1..300 once, in order, and the job ends converged."""
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    args = [
        *("-np", "2", "--num-ps", "2", "--ps-mode", "sync", "--ps-replicas", "1"),
        *("python", str(PS_LINEAR), str(out), "--steps", "300", "--record-steps"),
        *("--pause-while", str(hold)),
    ]
    with ElasticRun(args, tmp_path / "run") as run:
        wait_until(
            lambda: all(len(s) >= 30 for s in _steps(out).values()) and len(_steps(out)) == 2,
            60,
            f"step 30; {run.stderr_tail()}",
        )
        hold.write_text("")  # however fast training is, the kill lands before its end
        primary = shard_pid(run, 1)
        os.kill(primary, signal.SIGKILL)
        failed = run.wait_event("ps_failed_over", lambda e: e["shard"] == 1)
        backup = run.wait_event("ps_backup_ready", lambda e: e["shard"] == 1, after=1)
        hold.unlink()
        assert run.wait(timeout=100) == 0, run.stderr_tail()
        stderr = run.err_path.read_text()
        kinds = [e["kind"] for e in run.events()]
    assert list(_steps(out).values()) == [list(range(1, 301))] * 2
    check_converged(out, 300)
    assert failed["step"] >= 30 and backup["pid"] != primary
    assert f"ps shard 1 failed over from {failed['from_address']}" in stderr
    assert "ps_restarted" not in kinds and "ps_rolled_back" not in kinds
