"""An etcd that stalls (SIGSTOP for 30 s, as a leader election or a disk stall that
lasts) costs a job nothing: its workers train on the ring meanwhile, no process is
killed because a lease could not be renewed, the leases are taken again when etcd
answers, and the job ends exact with every commit made once, no step taken back.

Three jobs share one etcd and one stall (the suite's time): a plain etcd job, a join
job (two nodes: one leads, one stands by, and the standby does not take the store's
silence for its leader's) and a restart-mode world (not restarted)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

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
#: simulated compute per step (``--step-seconds``): the jobs outlast the stall
STEP_SECONDS = 0.05
STEPS = 1000  # about 50 s of training, the stall inside
SAMPLES = {"plain": STEPS * 4 * 2, "join": STEPS * 4 * 4}  # batches of 4, 2 and 4 workers


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


def _join_args(url: str, job_id: str, host: str, command: list[str]) -> list[str]:
    return [
        *("--join", "--rendezvous", url, "--job-id", job_id, "--host-name", host),
        *("-np", "4", "--min-np", "2", "--slots-per-host", "2", *command),
    ]


def _outputs(tmp_path: Path) -> dict[str, Path]:
    outs = {name: tmp_path / f"out-{name}" for name in ("plain", "join", "world")}
    for out in outs.values():
        out.mkdir()
    return outs


@pytest.mark.timeout(240)
def test_jobs_of_every_mode_ride_out_a_30s_etcd_stall(tmp_path, etcd_single):
    url, outs = etcd_single.url, _outputs(tmp_path)
    secret = {"ELASTIC_JOB_SECRET": secrets.token_hex(32)}

    def command(name: str) -> list[str]:
        return exact_sum_command(outs[name], SAMPLES[name], 1, "--step-seconds", str(STEP_SECONDS))

    def job_id() -> str:
        return f"s{uuid.uuid4().hex[:10]}"

    plain_args = ["-np", "2", "--rendezvous", url, "--job-id", job_id(), *command("plain")]
    joined = job_id()
    world_args = [
        *("--restart-workers", "-np", "2", "--rendezvous", url, "--job-id", job_id()),
        *(sys.executable, str(WORKLOADS / "world_gate.py"), str(outs["world"])),
    ]
    with ExitStack() as jobs:
        plain = jobs.enter_context(ElasticRun(plain_args, tmp_path / "plain", secret))
        a, b = (
            jobs.enter_context(
                ElasticRun(_join_args(url, joined, node, command("join")), tmp_path / node, secret)
            )
            for node in ("a", "b")
        )
        world = jobs.enter_context(ElasticRun(world_args, tmp_path / "world", secret))
        plain.wait_event("progress", after=1, timeout=60)  # (training)
        wait_until(lambda: a.events("progress") or b.events("progress"), 60, "the join job")
        wait_until(lambda: len(list(outs["world"].glob("*.json"))) == 2, 60, "the world")

        proc = etcd_single.procs[0]
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            time.sleep(STALL)  # (the stall itself: nothing to wait for)
        finally:
            os.kill(proc.pid, signal.SIGCONT)

        assert plain.wait(timeout=120) == 0, plain.stderr_tail()
        assert a.wait(timeout=60) == 0, a.stderr_tail()
        assert b.wait(timeout=30) == 0, b.stderr_tail()
        world.wait_event("store_back", timeout=30)
        (outs["world"] / "done").touch()
        assert world.wait(timeout=60) == 0, world.stderr_tail()

        _no_loss([plain])
        _no_loss([a, b])
        assert len(a.events("leading")) + len(b.events("leading")) == 1  # no takeover
        _no_loss([world], rounds=False)
        assert [e["world"] for e in world.events("world_started")] == [1]
    for name, size in (("plain", 2), ("join", 4)):
        (result, *_) = check_exact_sum(outs[name], SAMPLES[name], 1, final_size=size)
        assert result["commits"] == STEPS
    told = [json.loads(p.read_text()) for p in outs["world"].glob("*.json")]
    assert len(told) == 2  # nobody of the world started again
