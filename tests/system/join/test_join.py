"""Join mode: the same ``elastic-run --join`` command on every node (here two nodes of
one machine, named by ``--host-name``) makes one job, with no ssh: the first node leads,
the other stands by; the job finishes exact and every node exits 0. A node that brings
another shape, or no secret, is refused in one line and the job is untouched; so is a
node that joins a job that finished or failed, unless it asks for a new job."""

from __future__ import annotations

import os
import secrets
import signal
import time
import uuid

import pytest

from tests.support.etcd_cluster import free_ports
from tests.support.jobs import ElasticRun, check_exact_sum, exact_sum_command, hold_at

pytestmark = pytest.mark.system

SAMPLES, EPOCHS = 1200, 6


def join_args(etcd_url: str, job_id: str, host: str, command: list[str], np: int = 4, *extra: str):
    return [
        *("--join", "--rendezvous", etcd_url, "--job-id", job_id, "--host-name", host),
        *("-np", str(np), "--min-np", "2", "--slots-per-host", "2", *extra, *command),
    ]


@pytest.fixture
def secret_env():
    return {"ELASTIC_JOB_SECRET": secrets.token_hex(16)}


@pytest.mark.timeout(120)
def test_two_joined_nodes_train_one_job_to_an_exact_end(tmp_path, etcd_server, secret_env):
    out = tmp_path / "out"
    out.mkdir()
    job_id = f"j{uuid.uuid4().hex[:10]}"
    command = exact_sum_command(out, SAMPLES, EPOCHS)
    with (
        ElasticRun(
            join_args(etcd_server.url, job_id, "a", command), tmp_path / "a", secret_env
        ) as a,
        ElasticRun(
            join_args(etcd_server.url, job_id, "b", command), tmp_path / "b", secret_env
        ) as b,
    ):
        assert a.wait(timeout=90) == 0, a.stderr_tail()
        assert b.wait(timeout=30) == 0, b.stderr_tail()
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=4)


@pytest.mark.timeout(60)
def test_a_node_with_another_shape_is_refused_in_one_line(tmp_path, etcd_server, secret_env):
    out = tmp_path / "out"
    out.mkdir()
    job_id = f"j{uuid.uuid4().hex[:10]}"
    gate = tmp_path / "gate"
    hold_at(gate, 5)  # the job runs while the other node tries to join
    command = exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(gate))
    mine = join_args(etcd_server.url, job_id, "a", command, np=2)
    with ElasticRun(mine, tmp_path / "a", secret_env) as a:
        a.wait_event("round_formed", timeout=30)
        other = join_args(etcd_server.url, job_id, "b", command, np=3)
        with ElasticRun(other, tmp_path / "b", secret_env) as b:
            assert b.wait(timeout=30) == 2
            assert "-np 3 here, 2 in the job" in b.stderr_tail()
        same = join_args(etcd_server.url, job_id, "c", command, np=2)
        wrong = {"ELASTIC_JOB_SECRET": secrets.token_hex(16)}  # on etcd, nothing else says
        with ElasticRun(same, tmp_path / "c", wrong) as c:
            assert c.wait(timeout=30) == 2
            assert "ELASTIC_JOB_SECRET is not the secret job" in c.stderr_tail()
        assert a.proc is not None and a.proc.poll() is None  # the job goes on
        gate.unlink()
        assert a.wait(timeout=60) == 0, a.stderr_tail()
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)


@pytest.mark.timeout(30)
def test_join_mode_without_a_secret_says_how_to_make_one(tmp_path, etcd_server):
    args = join_args(etcd_server.url, "nosecret", "a", ["python", "-c", "pass"])
    with ElasticRun(args, tmp_path, {"ELASTIC_JOB_SECRET": ""}) as run:
        assert run.wait(timeout=20) == 2
    assert "ELASTIC_JOB_SECRET" in run.stderr_tail() and "secrets.token_hex" in run.stderr_tail()


@pytest.mark.timeout(120)
def test_the_leading_nodes_loss_leaves_the_other_node_leading_to_an_exact_end(
    tmp_path, etcd_server, secret_env
):
    """Node a leads, node b stands by, and -H adds a host that runs no elastic-run of
    its own (localhost: its agent started by the leader). a dies whole (its elastic-run,
    agent and workers SIGKILLed: a lost node). b takes the job over, the workers of b
    and of the -H host train on, exact."""
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    hold_at(gate, 20)
    job_id = f"j{uuid.uuid4().hex[:10]}"
    command = exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(gate))
    a, b = (
        ElasticRun(
            join_args(etcd_server.url, job_id, node, command, 6, "-H", "localhost:2"),
            tmp_path / node,
            secret_env,
        )
        for node in ("a", "b")
    )
    with a:
        try:
            a.wait_event("leading", timeout=30)  # a leads: it started first
            b.start()
            formed = a.wait_event("round_formed", lambda e: e["size"] == 6, timeout=30)
            assert sum(m.startswith("localhost-") for m in formed["members"]) == 2, formed
            doomed = [pid for w, pid in a.worker_pids().items() if w.startswith("a-")]
            assert a.proc is not None
            os.killpg(a.proc.pid, signal.SIGKILL)  # elastic-run and its agent: one group
            for pid in doomed:
                os.kill(pid, signal.SIGKILL)
            taken = b.wait_event("leading", timeout=30)
            assert taken["how"] == "adopted" and taken["adopted"] >= 4, taken  # (a's, if seen)
            gate.unlink()
            assert b.wait(timeout=60) == 0, b.stderr_tail()
        finally:
            b.stop()  # (started in the block: stopped even when it fails)
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("leaving", ["a", "b"], ids=["the-leader", "a-standby"])
def test_a_sigtermed_node_drains_exits_0_and_the_job_goes_on_exact(
    tmp_path, etcd_server, secret_env, leaving
):
    """SIGTERM to one node's elastic-run (a preemption, a scale-down), training running
    free: its host drains (its workers leave at their next commit: no committed step is
    lost), the lead goes to the other node when it had it, it exits 0, and the job
    finishes exact on the other node."""
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    hold_at(gate, 20)
    job_id = f"j{uuid.uuid4().hex[:10]}"
    command = exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(gate))
    runs = {
        host: ElasticRun(
            join_args(etcd_server.url, job_id, host, command), tmp_path / host, secret_env
        )
        for host in ("a", "b")
    }
    staying = "b" if leaving == "a" else "a"
    with runs["a"]:
        runs["a"].wait_event("leading", timeout=30)
        with runs["b"]:
            runs["a"].wait_event("round_formed", lambda e: e["size"] == 4, timeout=30)
            proc = runs[leaving].proc
            assert proc is not None
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            gate.unlink()  # every worker trains on, mid-step when the round changes
            assert runs[leaving].wait(timeout=40) == 0, runs[leaving].stderr_tail()
            print(f"SIGTERM to the drained node's exit: {time.monotonic() - sent:.2f}s")
            assert "left the job" in runs[leaving].stderr_tail()
            assert runs[staying].wait(timeout=60) == 0, runs[staying].stderr_tail()
    results = check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
    # Running free, a survivor that the handover round reaches just after a commit the
    # others switched at redoes the start of one step (to its first collective): no
    # committed step is lost, at most that once per survivor (docs/DESIGN.md).
    assert all(r["rollbacks"] <= 1 for r in results), results


@pytest.mark.timeout(120)
def test_a_node_serves_the_store_for_the_job_embedded(tmp_path, secret_env):
    """``--rendezvous embedded://HOST:PORT``: the node named HOST serves the job's store
    (no etcd at all), the other node uses it; they train one job to an exact end. The
    serving node is started last: the other waits for its store."""
    out = tmp_path / "out"
    out.mkdir()
    job_id = f"j{uuid.uuid4().hex[:10]}"
    url = f"embedded://localhost:{free_ports(1)[0]}"
    command = exact_sum_command(out, SAMPLES, EPOCHS)
    with (
        ElasticRun(join_args(url, job_id, "b", command), tmp_path / "b", secret_env) as b,
        ElasticRun(join_args(url, job_id, "localhost", command), tmp_path / "a", secret_env) as a,
    ):
        assert b.wait(timeout=90) == 0, b.stderr_tail()
        assert a.wait(timeout=30) == 0, a.stderr_tail()
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=4)


def _ended_line(run: ElasticRun) -> str:
    """The one line of a node refused because its job ended (exit 2 checked by the
    caller): nothing of a job started."""
    (line,) = run.err_path.read_text().strip().splitlines()
    assert not run.events("job_started"), run.events()
    return line


@pytest.mark.timeout(150)
def test_a_node_that_joins_a_finished_job_is_refused_unless_it_asks_for_a_new_job(
    tmp_path, etcd_server, secret_env
):
    """A job that finished stays finished: a node that joins it afterwards (the same
    command, the same --job-id) is refused in one line naming how and when it ended, and
    starts nothing; with --new-job it trains a new job under the id to an exact end,
    whose own end then refuses the next node."""
    out = tmp_path / "out"
    out.mkdir()
    job_id = f"j{uuid.uuid4().hex[:10]}"
    command = exact_sum_command(out, 400, 4)
    args = join_args(etcd_server.url, job_id, "a", command, 2)
    with ElasticRun(args, tmp_path / "first", secret_env) as first:
        assert first.wait(timeout=60) == 0, first.stderr_tail()
    done = first.events("job_done")[-1]
    check_exact_sum(out, 400, 4, final_size=2)
    results = sorted(p.stat().st_mtime_ns for p in out.iterdir())

    with ElasticRun(args, tmp_path / "late", secret_env) as late:
        assert late.wait(timeout=30) == 2, late.stderr_tail()
    line = _ended_line(late)
    assert line.startswith(f"elastic-run: error: --join: job '{job_id}' finished at 20"), line
    assert f"(job done in round {done['round']} at step {done['step']}" in line, line
    assert "give --new-job to start a new job under this id" in line, line
    assert sorted(p.stat().st_mtime_ns for p in out.iterdir()) == results  # nothing ran

    again = join_args(etcd_server.url, job_id, "a", command, 2, "--new-job")
    with ElasticRun(again, tmp_path / "again", secret_env) as new:
        assert new.wait(timeout=60) == 0, new.stderr_tail()
    check_exact_sum(out, 400, 4, final_size=2)
    with ElasticRun(args, tmp_path / "later", secret_env) as later:
        assert later.wait(timeout=30) == 2, later.stderr_tail()
    assert f"job '{job_id}' finished at" in _ended_line(later)


@pytest.mark.timeout(90)
def test_a_failed_job_refuses_a_late_node_and_a_stopped_one_is_resumed(
    tmp_path, etcd_server, secret_env
):
    failing = ["python", "-c", "raise SystemExit(3)"]
    failed_id = f"j{uuid.uuid4().hex[:10]}"
    args = join_args(etcd_server.url, failed_id, "a", failing, 2)
    with ElasticRun(args, tmp_path / "failed", secret_env) as failed:
        assert failed.wait(timeout=60) == 1, failed.stderr_tail()
    with ElasticRun(args, tmp_path / "late", secret_env) as late:
        assert late.wait(timeout=30) == 2, late.stderr_tail()
    line = _ended_line(late)
    assert f"--join: job '{failed_id}' failed at 20" in line and "exit 3" in line, line

    # SIGTERM stops a job, which is no end: the same command takes it up again.
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    hold_at(gate, 5)
    stopped_id = f"j{uuid.uuid4().hex[:10]}"
    command = exact_sum_command(out, 400, 4, "--pause-while", str(gate))
    args = join_args(etcd_server.url, stopped_id, "a", command, 2)
    with ElasticRun(args, tmp_path / "stopped", secret_env) as stopped:
        stopped.wait_event("round_formed", timeout=30)
        assert stopped.proc is not None
        stopped.proc.send_signal(signal.SIGTERM)
        assert stopped.wait(timeout=40) == 128 + signal.SIGTERM, stopped.stderr_tail()
    gate.unlink()
    with ElasticRun(args, tmp_path / "resumed", secret_env) as resumed:
        assert resumed.wait(timeout=60) == 0, resumed.stderr_tail()
    check_exact_sum(out, 400, 4, final_size=2)
