"""What a worker of a world of restart mode is told (``driver.job.wiring.torchrun_env``,
``world_spec``): torchrun's variables, and its launch behind the world's entry."""

from __future__ import annotations

import sys

import pytest

from driver.config import parse_args
from driver.job.wiring import (
    MAX_RESTARTS_UNLIMITED,
    JobWiring,
    WorkerSeat,
    torchrun_env,
    world_spec,
)
from driver.policy import planner
from driver.policy.planner import WorkerSlot

pytestmark = pytest.mark.unit  # pure logic: no process, no socket

WORLD = planner.lay_out_world(
    3, 2, [WorkerSlot("a", 0), WorkerSlot("a", 1), WorkerSlot("b", 0), WorkerSlot("b", 1)]
)


def test_each_worker_gets_the_variables_torchrun_sets():
    env = torchrun_env("job-7", WORLD, WORLD.seats[3], reset_limit=5)
    assert env == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_NAME": "default",
        "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "5",
        "TORCHELASTIC_RUN_ID": "job-7",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }


def test_no_reset_limit_is_a_count_no_job_reaches():
    env = torchrun_env("j", WORLD, WORLD.seats[0], reset_limit=None)
    assert env["TORCHELASTIC_MAX_RESTARTS"] == str(MAX_RESTARTS_UNLIMITED)
    assert env["RANK"] == env["LOCAL_RANK"] == env["GROUP_RANK"] == "0"


def test_a_world_worker_starts_behind_the_entry_with_the_job_wiring():
    config = parse_args(
        ["--restart-workers", "-np", "4", "-H", "a:2,b:2", "--job-id", "j", "python", "t.py"]
    )
    seat = WORLD.seats[2]
    wiring = JobWiring(config, "s3cret", "embedded://d:1")
    worker = WorkerSeat("b-0-9", seat.host, seat.slot, "10.0.0.2")
    spec = world_spec(wiring, worker, WORLD, seat)
    entry = (sys.executable, "-m", "driver.programs.world_entry", "--")
    assert spec.command == (*entry, "python", "t.py")
    assert (spec.host, spec.slot, spec.label) == ("b", 0, "b:0")
    assert spec.env["ELASTIC_WORLD"] == "3" and spec.env["RANK"] == "2"
    assert spec.env["ELASTIC_WORKER_ID"] == "b-0-9" and spec.env["ELASTIC_BIND_HOST"] == "10.0.0.2"
    assert spec.env["ELASTIC_JOB_SECRET"] == "s3cret"
    assert spec.env["ELASTIC_ROUND_TIMEOUT"] == f"{config.start_timeout:g}"
    assert "MASTER_PORT" not in spec.env  # rank 0's host picks it (driver.programs.world_entry)
