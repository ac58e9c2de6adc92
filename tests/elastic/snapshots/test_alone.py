"""Snapshots of a script that trains alone (no elastic-run): ``ELASTIC_CHECKPOINT_DIR``
is enough, and the same script run again resumes; a torn newest snapshot is skipped
for the one before it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from elastic.snapshots import files
from tests.support.paths import ROOT, WORKLOADS

COUNTER = WORKLOADS / "counter.py"


def run_counter(ckpt, steps: int, *extra: str) -> list[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ELASTIC_CHECKPOINT_DIR": str(ckpt),
        "ELASTIC_CHECKPOINT_INTERVAL": "0.2",
    }
    env.pop("ELASTIC_RENDEZVOUS", None)
    done = subprocess.run(
        [sys.executable, str(COUNTER), str(steps), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines() + done.stderr.splitlines()


@pytest.mark.timeout(90)
def test_a_lone_script_resumes_from_its_newest_snapshot(tmp_path):
    ckpt = tmp_path / "ckpt"
    first = run_counter(ckpt, 200)
    assert "resumed-at 0" in first and "done 200 200.0 200.0" in first
    snapshots = files.complete(str(ckpt))
    assert 1 <= len(snapshots) <= 3  # the newest three are kept
    newest = snapshots[0][0].step
    second = run_counter(ckpt, 260)
    assert f"resumed-at {newest}" in second and "done 260 260.0 260.0" in second


@pytest.mark.timeout(90)
def test_a_torn_newest_snapshot_is_said_and_the_one_before_used(tmp_path):
    ckpt = tmp_path / "ckpt"
    run_counter(ckpt, 200)
    (newest, folder), (previous, _) = files.complete(str(ckpt))[:2]
    part = os.path.join(folder, files.part_name(0, 1))
    os.truncate(part, os.path.getsize(part) // 2)
    lines = run_counter(ckpt, 250)
    said = [line for line in lines if f"snapshot of commit {newest.step} is unusable" in line]
    assert (said and "shorter than" in said[0]) or "bytes, the manifest says" in said[0]
    assert f"resumed-at {previous.step}" in lines and "done 250 250.0 250.0" in lines
