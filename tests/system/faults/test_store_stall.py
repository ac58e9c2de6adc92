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

import pytest

from tests.support.jobs import (
    WORKLOADS,
    ElasticRun,
    check_exact_sum,
    exact_sum_command,
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


def _no_loss(runs: list[ElasticRun], rounds: bool = True) -> None:
    """No worker of the job failed, was killed or replaced: never a lost host, never a
    step back, and (``rounds``) one round."""
    for run in runs:
        for kind in ("worker_failed", "host_unreachable", "job_failed", "state_lost"):
            assert not run.events(kind), (kind, run.events(kind), run.stderr_tail())
    if not rounds:
        return
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
    (result, *_) = check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
    assert result["commits"] == SAMPLES * EPOCHS // (4 * 2)


def _join_args(url: str, job_id: str, host: str, command: list[str]) -> list[str]:
    return [
        *("--join", "--rendezvous", url, "--job-id", job_id, "--host-name", host),
        *("-np", "4", "--min-np", "2", "--slots-per-host", "2", *command),
    ]


@pytest.mark.timeout(150)
def test_a_join_job_rides_out_a_30s_stall(tmp_path, etcd_single):
    """Two joined nodes: the leading one keeps the lead (its standby does not take a
    silence of the store for a silent leader), and every worker trains on."""
    out = tmp_path / "out"
    out.mkdir()
    job_id = f"s{uuid.uuid4().hex[:10]}"
    secret = {"ELASTIC_JOB_SECRET": secrets.token_hex(32)}
    samples = SAMPLES * 2  # four workers: as many steps as the plain job's two
    command = exact_sum_command(out, samples, EPOCHS, "--step-seconds", str(STEP_SECONDS))
    with (
        ElasticRun(_join_args(etcd_single.url, job_id, "a", command), tmp_path / "a", secret) as a,
        ElasticRun(_join_args(etcd_single.url, job_id, "b", command), tmp_path / "b", secret) as b,
    ):
        wait_until(lambda: a.events("leading") or b.events("leading"), 30, "a node leading")
        leader = a if a.events("leading") else b
        _stalled(etcd_single, leader, STALL)
        assert a.wait(timeout=90) == 0, a.stderr_tail()
        assert b.wait(timeout=30) == 0, b.stderr_tail()
        assert len(a.events("leading")) + len(b.events("leading")) == 1  # no takeover
        _no_loss([a, b])
    (result, *_) = check_exact_sum(out, samples, EPOCHS, final_size=4)
    assert result["commits"] == samples * EPOCHS // (4 * 4)


@pytest.mark.timeout(150)
def test_a_restart_mode_world_rides_out_a_30s_stall(tmp_path, etcd_single):
    """``--restart-workers``: the world is not restarted (it does not use the store
    while it trains); it ends in world 1."""
    out = tmp_path / "out"
    out.mkdir()
    job_id = f"s{uuid.uuid4().hex[:10]}"
    args = [
        *("--restart-workers", "-np", "2", "--rendezvous", etcd_single.url, "--job-id", job_id),
        *(sys.executable, str(WORKLOADS / "world_gate.py"), str(out)),
    ]
    with ElasticRun(args, tmp_path / "run") as run:
        wait_until(lambda: len(list(out.glob("*.json"))) == 2, 60, "world 1's workers")
        proc = etcd_single.procs[0]
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            time.sleep(STALL)  # (the stall itself: nothing to wait for)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        run.wait_event("store_back", timeout=30)
        (out / "done").touch()
        assert run.wait(timeout=60) == 0, run.stderr_tail()
        assert [e["world"] for e in run.events("world_started")] == [1]
        assert not run.events("world_stopping") or all(
            not e["failure"] for e in run.events("world_stopping")
        )
        _no_loss([run], rounds=False)
    assert len(list(out.glob("*.json"))) == 2  # nobody started again
