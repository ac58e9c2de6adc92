"""Sharded models (``et.fully_shard``, FSDP2 on gloo) under real workers and real
SIGKILLs: a small transformer-shaped model sharded per block, trained with Adam,
clipping and an LR schedule (``workloads/sharded_torch.py``).

Four workers; rank 1 SIGKILLs itself in the middle of step 6 (after its forward). The
three survivors reshard the model and the optimizer in place onto three (rank 1's
part from its mirror), train on, and wait at step 12 for the replacement, which
grows the world back to four the same way. The parameters at the end equal those of
one process on the same global batches, and every sample is seen once per epoch.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.support.jobs import WORKLOADS, ElasticRun

SHARDED = WORKLOADS / "sharded_torch.py"


def worst_relative_error(reference: dict, params: dict) -> float:
    worst = 0.0
    for name, values in reference.items():
        a = torch.tensor(values, dtype=torch.float64)
        b = torch.tensor(params[name], dtype=torch.float64)
        worst = max(worst, float((a - b).norm() / a.norm()))
    return worst


@pytest.mark.timeout(150)
def test_sharded_model_loses_a_worker_mid_step_reshards_and_grows_back(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    flag = tmp_path / "kill-once"
    flag.write_text("")
    subprocess.run([sys.executable, str(SHARDED), str(out), "--reference"], check=True)
    command = ["python", str(SHARDED), str(out), "--kill-flag", str(flag), "--grow-to", "4"]
    with ElasticRun(["-np", "4", "--min-np", "3", *command], tmp_path) as run:
        assert run.wait(timeout=130) == 0, run.stderr_tail()
        assert len(run.events("worker_failed")) >= 1
    assert (out / "killed-at").exists()
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 24 and result["sizes"] == [4, 3, 4]
    assert result["same_objects"]  # the optimizer still holds the module's parameters
    assert result["visits_min"] == result["visits_max"] == 2.0  # once per epoch
    reference = json.loads((out / "reference.json").read_text())
    assert worst_relative_error(reference, result["params"]) < 1e-5
