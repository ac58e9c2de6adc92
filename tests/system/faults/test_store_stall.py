"""An etcd that stalls (SIGSTOP for 30 s, as a leader election or a disk stall that
lasts) costs a job nothing: its workers train on the ring meanwhile, no process is
killed because a lease could not be renewed, the leases are taken again when etcd
answers, and the job ends exact with every commit made once, no step taken back. For
a plain etcd job, a join job (two nodes: one leads, one stands by) and a restart-mode
world."""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support.jobs import (
    WORKLOADS,
    ElasticRun,
    check_exact_sum,
    exact_sum_command,
    exact_sum_results,
    wait_until,
)

pytestmark = pytest.mark.system

STALL = 30.0
#: steps a worker takes per second (``--step-seconds``): the job outlasts the stall
STEP_SECONDS = 0.05
SAMPLES, EPOCHS = 9600, 1  # 1200 steps of 8 samples: about 60 s of training, the stall inside


def _stalled(etcd, run: ElasticRun, seconds: float) -> None:
    """SIGSTOP etcd for ``seconds`` once the job has said its progress twice (it trains),
    then SIGCONT it."""
    run.wait_event("progress", after=1, timeout=60)
    proc = etcd.procs[0]
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)  # (the stall itself: nothing to wait for)
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def _no_loss(runs: list[ElasticRun]) -> None:
    """No worker of the job failed, was killed or replaced: one round, never a lost
    host, never a step back."""
    for run in runs:
        for kind in ("worker_failed", "host_unreachable", "job_failed", "state_lost"):
            assert not run.events(kind), (kind, run.events(kind), run.stderr_tail())
    formed = [e for run in runs for e in run.events("round_formed")]
    assert len({e["round"] for e in formed}) == 1, formed


@pytest.mark.timeout(150)
def test_a_plain_etcd_job_rides_out_a_30s_stall(tmp_path, etcd_single):
    out = tmp_path / "out"
    out.mkdir()
    job_id = f"s{uuid.uuid4().hex[:10]}"
    command = exact_sum_command(out, SAMPLES, EPOCHS, "--step-seconds", str(STEP_SECONDS))
    args = ["-np", "2", "--rendezvous", etcd_single.url, "--job-id", job_id, *command]
    with ElasticRun(args, tmp_path / "run") as run:
        _stalled(etcd_single, run, STALL)
        assert run.wait(timeout=90) == 0, run.stderr_tail()
        _no_loss([run])
    (result, _) = check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
    assert result["commits"] == SAMPLES * EPOCHS // (4 * 2)
