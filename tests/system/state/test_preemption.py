"""A host the scheduler takes back: SIGTERM to its agent (etcd store: every host's
processes run under its agent).

With enough members elsewhere, its workers leave at their next commit and the others go
on from that very commit: nothing is rolled back (a handover). With too few, the job
has a snapshot of the newest commit written before that host's workers stop, then trains
on without it. Both finish exact."""

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


def preempt_b(run: ElasticRun, url: str, job_id: str):
    """At commit 40, SIGTERM to host b's agent: (its agent, b's workers, the event)."""
    run.wait_progress(40)
    victims = sorted(w for w in run.worker_pids() if w.startswith("b-"))
    agent = agents(url, job_id)["b"]
    os.kill(agent.pid, signal.SIGTERM)
    return agent, victims, run.wait_event("host_preempted", timeout=20)


@pytest.mark.timeout(120)
def test_a_preempted_hosts_workers_leave_at_their_commit_and_nothing_is_rolled_back(
    tmp_path, etcd_server
):
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    job_id = f"t{uuid.uuid4().hex[:10]}"
    hold_at(gate, 40)  # however fast the job, the preemption lands mid-run
    args = [
        *("-H", "a:2,b:2", "-np", "4", "--min-np", "2", "--launcher", "local"),
        *("--rendezvous", etcd_server.url, "--job-id", job_id),
        *exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(gate)),
    ]
    with ElasticRun(args, tmp_path) as run:
        agent, victims, preempted = preempt_b(run, etcd_server.url, job_id)
        assert preempted["host"] == "b" and preempted["handover"], preempted
        assert preempted["workers"] == victims and not preempted["snapshot"]
        handed = run.wait_event("round_formed", lambda e: e["size"] == 2, timeout=20)
        gate.unlink()  # the held workers take one more step together, and commit it
        wait_until(lambda: not pid_alive(agent.pid), 30, "the preempted agent to exit")
        assert run.wait(timeout=60) == 0, run.stderr_tail()
        said = "\n".join(str(e) for e in run.events())
        assert not run.events("host_unreachable") and not run.events("worker_failed"), said
        assert handed["elapsed"] > preempted["elapsed"]
    results = check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
    assert [r["rollbacks"] for r in results] == [0, 0], results


@pytest.mark.timeout(120)
def test_with_too_few_left_a_preempted_hosts_workers_stop_after_a_snapshot_and_it_ends_exact(
    tmp_path, etcd_server
):
    out, gate, ckpt = tmp_path / "out", tmp_path / "gate", tmp_path / "ckpt"
    out.mkdir()
    job_id = f"t{uuid.uuid4().hex[:10]}"
    hold_at(gate, 40)  # however fast the job, the preemption lands mid-run
    args = [
        # b's 2 members would leave 2, below --min-np 3: no handover; c refills.
        *("-H", "a:2,b:2,c:2", "-np", "4", "--min-np", "3", "--max-np", "4"),
        "--launcher",
        "local",
        *("--rendezvous", etcd_server.url, "--job-id", job_id),
        *("--checkpoint-dir", str(ckpt), "--checkpoint-interval", "600"),
        *exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(gate)),
    ]
    with ElasticRun(args, tmp_path) as run:
        agent, victims, preempted = preempt_b(run, etcd_server.url, job_id)
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
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=4)
