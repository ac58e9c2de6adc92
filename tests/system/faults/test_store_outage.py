"""An etcd that stays away for longer than the job's bound (``--elastic-timeout``) ends
the job, said in one line that names the newest committed step the driver heard and
the snapshot that stands. With ``--checkpoint-dir`` the workers keep snapshotting
while the store is away (rank 0 writes the whole replicated state alone: its writers
cannot agree through a store that does not answer), so the same command, once the
store is back, resumes from a commit made during the outage, exact."""

from __future__ import annotations

import os
import re
import secrets
import signal
import uuid

import pytest

from tests.support.jobs import (
    ElasticRun,
    check_exact_sum,
    exact_sum_command,
)

pytestmark = pytest.mark.system

BOUND = 8.0  # --elastic-timeout: the outage the job waits out before it ends
STEP_SECONDS = 0.02
STEPS = 1200  # 24 s of training at least: the outage (from ~3 s to ~17 s) ends the first run
SAMPLES = STEPS * 4 * 2  # batches of 4, 2 workers


@pytest.mark.timeout(200)
def test_an_etcd_outage_past_the_bound_ends_the_job_with_a_snapshot(tmp_path, etcd_single):
    url, out, ckpt = etcd_single.url, tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    secret = {"ELASTIC_JOB_SECRET": secrets.token_hex(32)}
    command = exact_sum_command(out, SAMPLES, 1, "--step-seconds", str(STEP_SECONDS))
    args = [
        *("-np", "2", "--rendezvous", url, "--job-id", f"o{uuid.uuid4().hex[:10]}"),
        *("--checkpoint-dir", str(ckpt), "--checkpoint-interval", "2"),
        *("--elastic-timeout", str(BOUND), *command),
    ]
    proc = etcd_single.procs[0]
    assert proc is not None
    with ElasticRun(args, tmp_path / "first", secret) as first:
        first.wait_event("snapshot_written", timeout=60)  # (training, one snapshot done)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            code = first.wait(timeout=BOUND + 60)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        tail = first.stderr_tail()
        assert code == 1, tail
        assert "lost the rendezvous store" in tail, tail
        heard = re.search(r"the newest step heard committed was (\d+)", tail)
        stands = re.search(r"the newest snapshot, of step (\d+), stands", tail)
        assert heard and stands, tail
        # taken during the outage: newer than any the driver heard of (rank 0 wrote it
        # alone and could not tell), and than the newest commit heard
        announced = max(e["step"] for e in first.events("snapshot_written"))
        assert int(stands.group(1)) > max(announced, int(heard.group(1))), tail
    with ElasticRun(args, tmp_path / "second", secret) as second:
        assert second.wait(timeout=120) == 0, second.stderr_tail()
        resumed = second.events("snapshot_resumed")
        assert resumed and resumed[0]["step"] == int(stands.group(1)), resumed
    check_exact_sum(out, SAMPLES, 1, final_size=2)
