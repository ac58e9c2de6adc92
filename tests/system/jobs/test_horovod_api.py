"""``elastic.horovod`` in a real job: Horovod's names on two workers under ``elastic-run``.

One job (``workloads/horovod_checks.py``) runs every check, paying for the torch import
once; the tests below read each worker's results and compare them with what Horovod
documents for the same calls.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.jobs import WORKLOADS, ElasticRun

CHECKS = WORKLOADS / "horovod_checks.py"


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> list[dict]:
    work = tmp_path_factory.mktemp("horovod-checks")
    out = work / "out"
    out.mkdir()
    with ElasticRun(["-np", "2", "python", str(CHECKS), str(out)], work) as run:
        assert run.wait(timeout=100) == 0, run.stderr_tail()
    found = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank-*.json"))]
    assert [r["layout"]["rank"] for r in found] == [0, 1], found
    return found


@pytest.mark.timeout(150)
def test_layout_is_the_jobs(checks):
    for rank, r in enumerate(checks):
        assert r["layout"] == {
            "rank": rank,
            "size": 2,
            "local_rank": rank,  # both workers on localhost
            "local_size": 2,
            "cross_rank": 0,
            "cross_size": 1,
            "is_initialized": True,
            "mpi_enabled": False,  # our ring, under elastic-run: no MPI, Gloo or NCCL
            "mpi_threads_supported": False,
            "gloo_enabled": False,
            "nccl_built": False,
        }


@pytest.mark.timeout(150)
def test_collectives_take_horovods_ops_and_names(checks):
    for r in checks:
        c = r["collectives"]
        assert c["average_by_default"] == [1.5, 1.5]  # ranks hold 1 and 2
        assert c["sum"] == c["average_false_is_sum"] == [3.0, 3.0]
        assert c["min"] == [1.0, 1.0] and c["max"] == [2.0, 2.0]
        assert c["scaled"] == [1.5, 1.5]  # (2 * 1 + 2 * 2) * 0.25
        values, dtype = c["fp16"]
        assert dtype == "torch.float32" and values == pytest.approx([0.15, 0.15], abs=1e-3)
        assert c["in_place"] == [[3.0, 3.0], True, True]  # the same tensor, same storage
        assert c["allgather"] == [[0], [1], [1]]
        assert c["broadcast"] == [1.0, 2.0, 3.0] and c["broadcast_in_place"] == [1.0] * 3
        assert c["broadcast_object"] == {"from": 1}
        assert c["allgather_object"] == [0, 1]


@pytest.mark.timeout(150)
def test_adasum_is_refused_in_one_line_on_every_rank(checks):
    for r in checks:
        message = r["collectives"]["adasum"]
        assert message is not None and "\n" not in message
        assert "hvd.Adasum is not supported" in message and "hvd.Average" in message


@pytest.mark.timeout(150)
def test_broadcast_parameters_and_optimizer_state_from_a_root_rank(checks):
    for r in checks:
        b = r["broadcasts"]
        assert b["params_same"] and b["same_object"]
        assert b["lr"] == pytest.approx(0.02)  # rank 1's hyper-parameters
        assert b["adam_steps"] == 1.0  # rank 1's Adam state, on rank 0 too


@pytest.mark.timeout(150)
def test_distributed_optimizer_averages_sums_and_compresses(checks):
    for r in checks:
        o = r["optimizer"]  # gradients 0.1 and 0.2, SGD with lr 1 from zeros
        assert o["average"] == pytest.approx([-0.15] * 4, abs=1e-7)
        assert o["sum"] == pytest.approx([-0.3] * 4, abs=1e-7)
        assert o["fp16"] == pytest.approx([-0.15] * 4, abs=1e-3)
        assert o["fp16"] != o["average"]  # it did travel as float16
        assert o["two_passes_sum"] == pytest.approx([-0.6] * 4, abs=1e-7)


@pytest.mark.timeout(150)
def test_elastic_state_sampler_and_run(checks):
    for r in checks:
        s = r["state"]
        assert s["positional"] and s["restored"]
        # sync adopts the worker with the most commits (rank 1), in place everywhere
        assert s["synced_same"] and s["synced_epoch"] == 7
        sampler = r["sampler"]
        assert sampler["shares"] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]] and sampler["length"] == 5
        assert sampler["after_one_batch"] == [[4, 6, 8], [5, 7, 9]]  # the rest, split again
        assert r["run"] == {"result": "done", "seen": [2.0, 2.0, 2.0]}
