"""A host the scheduler takes back: SIGTERM to its agent (etcd store: every host's
processes run under its agent). The job has a snapshot of the newest commit written
before that host's workers stop, then trains on without it, exact."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from tests.support.jobs import (
    ElasticRun,
    agents,
    check_exact_sum,
    exact_sum_command,
    hold_at,
    pid_alive,
    wait_until,
)

pytestmark = pytest.mark.system

SAMPLES, EPOCHS = 1200, 12


@pytest.mark.timeout(120)
def test_a_preempted_hosts_workers_stop_after_a_snapshot_and_the_job_finishes_exact(
    tmp_path, etcd_server
):
    out, gate, ckpt = tmp_path / "out", tmp_path / "gate", tmp_path / "ckpt"
    out.mkdir()
    job_id = f"t{uuid.uuid4().hex[:10]}"
    hold_at(gate, 40)  # however fast the job, the preemption lands mid-run
    args = [
        *("-H", "a:2,b:2", "-np", "4", "--min-np", "2", "--launcher", "local"),
        *("--rendezvous", etcd_server.url, "--job-id", job_id),
        *("--checkpoint-dir", str(ckpt), "--checkpoint-interval", "600"),
        *exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(gate)),
    ]
    with ElasticRun(args, tmp_path) as run:
        run.wait_progress(40)
        victims = sorted(w for w in run.worker_pids() if w.startswith("b-"))
        agent = agents(etcd_server.url, job_id)["b"]
        os.kill(agent.pid, signal.SIGTERM)
        preempted = run.wait_event("host_preempted", timeout=20)
        assert (
            preempted["host"] == "b" and preempted["snapshot"] and preempted["workers"] == victims
        )
        gate.unlink()  # the held workers reach their next commit: the snapshot round
        written = run.wait_event("snapshot_written", timeout=30)
        lost = run.wait_event("host_unreachable", lambda e: e["host"] == "b", timeout=30)
        assert preempted["elapsed"] < written["elapsed"] <= lost["elapsed"], (written, lost)
        assert sorted(lost["workers"]) == victims and "preempted" in lost["detail"]
        wait_until(lambda: not pid_alive(agent.pid), 30, "the preempted agent to exit")
        assert run.wait(timeout=60) == 0, run.stderr_tail()
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
