"""``elastic.torch`` on the process-group plane, with gloo (``ELASTIC_TORCH_BACKEND=gloo``):
the same plane the GPUs run on NCCL, under real worker processes and real SIGKILLs.

One job runs every in-job check of ``workloads/torch_checks.py`` on the gloo plane
(collectives, broadcasts, ``TorchState``, training equal to one process on the global
batch); one kills a member in the middle of a step's allreduce and times the
survivors' ``WorkerLostError``; one is a bounded chaos run that must end exact.
"""

from __future__ import annotations

import pytest

from tests.support.jobs import ElasticRun
from tests.system.jobs.test_torch_jobs import CHECKS, results

GLOO = {"ELASTIC_TORCH_BACKEND": "gloo"}


def train_command(out, steps: int, *extra: str) -> list[str]:
    return ["python", str(CHECKS), str(out), "train", "--steps", str(steps), *extra]


@pytest.mark.timeout(120)
def test_gloo_plane_collectives_and_training_equal_one_process(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    argv = ["-np", "2", "python", str(CHECKS), str(out), "collectives"]
    with ElasticRun(argv, tmp_path, env=GLOO) as run:
        assert run.wait(timeout=100) == 0, run.stderr_tail()
    found = results(out)
    assert [(r["rank"], r["plane"]) for r in found] == [(0, "gloo"), (1, "gloo")]
    for r in found:
        c = r["collectives"]
        assert c["allreduce_average"] == [[1.5, 1.5]] * 3
        assert c["allreduce_sum_in_place"] == [[[3.0, 3.0]] * 3, True]
        assert c["allreduce_int_max"] == [1, 0]
        assert c["broadcast"] == [1.0, 2.0, 3.0, 4.0]
        assert c["broadcast_bf16_in_place"] == [1.0] * 4
        assert c["allgather"] == [[0, 0], [1, 1], [1, 1]]
        assert c["bf16_allreduce"] == [3.0, 3.0]
        b, s = r["broadcasts"], r["state"]
        assert b["params_same"] and b["same_object"] and b["adam_steps"] == 1.0
        assert s["restored"] and s["synced_same"] and s["synced_n"] == 7
        assert r["overlap"]["first_launch_before_last_hook"]
        for case, tolerance in (("sgd", 1e-12), ("accumulate", 1e-12), ("adam", 1e-12)):
            assert r[case]["max_diff"] <= tolerance, (case, r[case])
            assert r[case]["identical_every_step"] and r[case]["unused_grad_zero"]
        assert r["fp16"]["max_diff"] <= 1e-3 and r["fp16"]["identical_every_step"]


@pytest.mark.timeout(120)
def test_gloo_plane_sigkill_mid_allreduce_every_survivor_raises_within_a_second(tmp_path):
    """Rank 1 SIGKILLs itself in step 5's backward, its first bucket started: the two
    others wait in that step's allreduce for buckets it never sends. Each raises
    WorkerLostError within 1 s of the kill, and the next rounds (two workers, then
    three with the replacement) train on to the end, equal to one process."""
    out = tmp_path / "out"
    out.mkdir()
    flag = tmp_path / "kill-once"
    flag.write_text("")
    steps = 40
    command = train_command(out, steps, "--kill-flag", str(flag), "--kill-at", "5")
    with ElasticRun(["-np", "3", "--min-np", "2", *command], tmp_path, env=GLOO) as run:
        assert run.wait(timeout=100) == 0, run.stderr_tail()
        assert len(run.events("worker_failed")) == 1
    killed_at = float((out / "killed-at").read_text())
    raised_at = sorted(float(p.read_text()) for p in out.glob("lost-at-*"))
    assert len(raised_at) == 2, raised_at  # both survivors, once each
    assert all(0 <= t - killed_at < 1.0 for t in raised_at), (killed_at, raised_at)
    final = results(out)
    assert len({r["digest"] for r in final}) == 1
    for r in final:
        assert r["plane"] == "gloo" and r["steps"] == steps
        assert r["max_diff"] < 1e-9  # the same as one process, no step lost


@pytest.mark.chaos
@pytest.mark.timeout(150)
def test_gloo_plane_chaos_run_ends_exact(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    steps = 600
    argv = ["-np", "3", "--min-np", "2", "--chaos-kill-interval", "1.5"]
    argv += ["--chaos-max-kills", "2", *train_command(out, steps, "--lr", "0.01")]
    with ElasticRun(argv, tmp_path, env=GLOO) as run:
        assert run.wait(timeout=130) == 0, run.stderr_tail()
        assert len(run.events("chaos_kill")) == 2
    final = results(out)
    assert len({r["digest"] for r in final}) == 1
    for r in final:
        assert r["plane"] == "gloo" and r["steps"] == steps
        assert r["max_diff"] < 1e-9
