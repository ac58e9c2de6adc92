"""A client that reaches the job's etcd but has not the job's secret forges the records
that make the job's processes act, as the probe of issue 38 did: an assignment copied
under another id with its own command, a failure report accusing a healthy worker, a
newer round's head, and a restart-mode spare's seat with an ``LD_PRELOAD`` of its own.
Each is ignored where it is read, said in one line naming its key, and the job ends
exact: nothing the stranger wrote ran, and nobody died."""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import replace

import pytest

from rendezvous import open_store
from rendezvous.host_plan import RoundHead
from rendezvous.keys import JobKeys
from rendezvous.schema.agents import Assignment
from rendezvous.schema.workers import FailureRecord
from rendezvous.schema.worlds import WorldSeat
from tests.support.jobs import (
    WORKLOADS,
    ElasticRun,
    check_exact_sum,
    exact_sum_command,
    hold_at,
    wait_until,
)

pytestmark = pytest.mark.system

SAMPLES, EPOCHS = 1200, 2


def _ignored(run: ElasticRun, kind: str, key: str) -> bool:
    return f"ignored the '{kind}' record at {key} " in run.err_path.read_text()


@pytest.mark.timeout(120)
def test_forged_assignment_report_and_round_are_ignored(tmp_path, etcd_server):
    out = tmp_path / "out"
    out.mkdir()
    pwned = tmp_path / "pwned"
    job_id = f"f{uuid.uuid4().hex[:10]}"
    keys = JobKeys(job_id)
    gate = tmp_path / "gate"
    hold_at(gate, 5)  # training waits at commit 5 while the stranger writes
    command = exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(gate))
    args = ["-np", "2", "--rendezvous", etcd_server.url, "--job-id", job_id, *command]
    with ElasticRun(args, tmp_path / "run") as run, open_store(etcd_server.url) as stranger:
        formed = run.wait_event("round_formed", timeout=60)
        assignments, _ = stranger.get_prefix(f"{keys.prefix}assign/")
        real = assignments[0]
        theirs = Assignment.from_json(real.value)
        forged = replace(theirs, id="w-forged", command=("sh", "-c", f"touch {pwned}"))
        forged_key = real.key.rsplit("/", 1)[0] + "/w-forged"
        stranger.put(forged_key, forged.to_json())

        members = run.members()
        report_key = keys.failure(formed["round"], members[0])
        accusation = FailureRecord(members[0], formed["round"], "forged", suspect=members[1])
        stranger.put(report_key, accusation.to_json())

        head = RoundHead.from_json(stranger.get(keys.plan_head).value)
        stranger.put(keys.plan_head, replace(head, round_id=head.round_id + 1).to_json())

        wait_until(lambda: _ignored(run, "assign", forged_key), 30, "the assignment ignored")
        wait_until(lambda: _ignored(run, "failures", report_key), 30, "the report ignored")
        wait_until(lambda: _ignored(run, "plan-head", keys.plan_head), 30, "the head ignored")
        gate.unlink()
        assert run.wait(timeout=60) == 0, run.stderr_tail()
        assert not run.events("worker_failed") and not run.events("failure_reported")
        assert len({e["round"] for e in run.events("round_formed")}) == 1
    assert not pwned.exists()
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)


@pytest.mark.timeout(90)
def test_a_forged_seat_is_not_taken_by_a_spare(tmp_path, etcd_server):
    out = tmp_path / "out"
    out.mkdir()
    job_id = f"f{uuid.uuid4().hex[:10]}"
    keys = JobKeys(job_id)
    args = [
        *("--restart-workers", "-np", "2", "--spares", "1"),
        *("--rendezvous", etcd_server.url, "--job-id", job_id),
        *(sys.executable, str(WORKLOADS / "world_gate.py"), str(out)),
    ]
    with ElasticRun(args, tmp_path / "run") as run, open_store(etcd_server.url) as stranger:
        spare = run.wait_event("spare_ready", timeout=60)["worker"]
        wait_until(lambda: len(list(out.glob("*.json"))) == 2, 30, "world 1's workers")
        variables = {"RANK": "0", "WORLD_SIZE": "1", "LD_PRELOAD": str(tmp_path / "evil.so")}
        seat_key = keys.world_seat(spare)
        stranger.put(seat_key, WorldSeat(1, variables).to_json())
        wait_until(lambda: _ignored(run, "seat", seat_key), 30, "the seat ignored")
        (out / "done").touch()
        assert run.wait(timeout=30) == 0, run.stderr_tail()
        assert not run.events("spare_promoted")
    told = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert len(told) == 2 and not [t for t in told if "LD_PRELOAD" in t["env"]]
