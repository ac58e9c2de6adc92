"""A ps checkpoint directory on a disk that fills up (a real 2 MiB tmpfs): checkpoints
that do not fit beside the ones kept make room by deleting the oldest first; attempts
that fail leave nothing behind and are said (once, then at most once a minute), and
go on once space is freed; a final checkpoint that cannot be written fails the job's
end, saying what a restart resumes from.

The model's ``w`` is 616 kB of float64, so a checkpoint takes about 620 kB: three fit
in the tmpfs, a fourth does not."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.jobs import WORKLOADS, ElasticRun
from tests.support.tmpfs import fill, small_tmpfs

PS_LINEAR = WORKLOADS / "ps_linear.py"
# What the ballast leaves free: none, so that no checkpoint fits, not even one taken
# before the worker made ``w`` (a few small files: under load the first attempt may
# come that early).
ROOM = 0


def _args(ckpt: Path, out: Path, steps: int, *extra: str) -> list[str]:
    return [
        *("-np", "1", "--num-ps", "2"),
        *("--ps-checkpoint-dir", str(ckpt), "--ps-checkpoint-interval", "0.2"),
        *("python", str(PS_LINEAR), str(out), "--steps", str(steps)),
        *("--features", "77000", "--samples", "16", "--batch", "16", *extra),
    ]


def _dirs(ckpt: Path) -> tuple[list[str], list[str]]:
    """The checkpoint directories in ``ckpt``, and those of them that are complete."""
    dirs = sorted(d for d in os.listdir(ckpt) if d.startswith("ckpt-"))
    return dirs, [d for d in dirs if (ckpt / d / "MANIFEST.json").exists()]


@pytest.mark.timeout(120)
def test_checkpoints_on_a_full_disk_are_said_and_go_on_once_space_is_freed(tmp_path):
    """Then more checkpoints than fit are written, each after the oldest made room,
    and SIGTERM's final one too."""
    out = tmp_path / "out"
    out.mkdir()
    with small_tmpfs(tmp_path / "ckpt") as ckpt:
        ballast = fill(ckpt, ROOM)
        with ElasticRun(_args(ckpt, out, 1_000_000), tmp_path / "run") as run:
            failed = run.wait_event("checkpoint_failed")
            assert "No space left on device" in failed["error"], failed
            assert not failed["final"] and failed["newest"] is None, failed
            ballast.unlink()
            run.wait_event("checkpoint_written", after=4)  # a fifth: more than fit
            os.kill(run.proc.pid, signal.SIGTERM)
            assert run.wait(timeout=60) == 128 + signal.SIGTERM, run.stderr_tail()
            written = run.events("checkpoint_written")
            failures = run.events("checkpoint_failed")
        dirs, complete = _dirs(ckpt)
    assert len(failures) == 1, failures  # the streak's first; none after the space came
    assert written[-1]["final"] and written[-1]["checkpoint"] == int(complete[-1][5:])
    assert dirs == complete and len(complete) <= 3, dirs  # none partial; pruned to 3


@pytest.mark.timeout(120)
def test_a_final_checkpoint_a_full_disk_refuses_fails_the_job_and_says_so(tmp_path):
    """The disk stays full: every attempt fails and leaves no folder, the streak is
    said once, and the job's end says the final checkpoint is not written and exits
    1, not 0 'job done'."""
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    hold.write_text("")  # the workers wait before their first step while it exists
    with small_tmpfs(tmp_path / "ckpt") as ckpt:
        fill(ckpt, ROOM)
        with ElasticRun(_args(ckpt, out, 60, "--pause-while", str(hold)), tmp_path / "run") as run:
            run.wait_event("checkpoint_failed")
            hold.unlink()
            assert run.wait(timeout=60) == 1, run.stderr_tail()
            failures = run.events("checkpoint_failed")
            failed_job = run.events("job_failed")
            done = run.events("job_done")
        dirs, _ = _dirs(ckpt)
    assert dirs == [], dirs  # no folder of any failed attempt
    first, final = failures  # the rest of the streak within a minute goes unsaid
    assert not first["final"] and final["final"], failures
    assert final["attempts"] > first["attempts"] and final["newest"] is None, final
    assert final["step"] >= 60 and "No space left on device" in final["error"], final
    assert not done and "final ps checkpoint not written" in failed_job[0]["reason"]
    stderr = (tmp_path / "run" / "stderr.log").read_text()
    assert "job failed: training finished, but final ps checkpoint not written" in stderr
    shard_lines = [line for line in stderr.splitlines() if "[ps0] WARNING" in line]
    assert len(shard_lines) == 2, shard_lines  # rate-limited as the driver's events
