"""``elastic.torch`` in real worker processes: elastic-run, mpiexec, alone, and SIGKILLs.

Importing torch costs seconds, so one job (``workloads/torch_checks.py collectives``) runs
every in-job check and the tests below read its per-worker results.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import ROOT, WORKLOADS, ElasticRun, wait_until

CHECKS = WORKLOADS / "torch_checks.py"
EXAMPLE = ROOT / "examples" / "train_torch_digits.py"


def results(out_dir: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("*.json"))]
    assert found, f"no worker wrote a result into {out_dir}"
    return sorted(found, key=lambda r: r["rank"])


def run_command(argv: list[str], timeout: float) -> str:
    """Run ``argv`` in its own process group (all of it killed on a timeout); its output.
    Raises AssertionError with the output when it fails."""
    proc = subprocess.Popen(
        argv,
        cwd=str(ROOT),
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    return text


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> list[dict]:
    work = tmp_path_factory.mktemp("torch-checks")
    out = work / "out"
    out.mkdir()
    with ElasticRun(["-np", "2", "python", str(CHECKS), str(out), "collectives"], work) as run:
        assert run.wait(timeout=100) == 0, run.stderr_tail()
    found = results(out)
    assert [r["rank"] for r in found] == [0, 1]
    return found


@pytest.mark.timeout(150)
def test_tensor_collectives(checks):
    for r in checks:
        c = r["collectives"]
        assert c["allreduce_average"] == [[1.5, 1.5]] * 3
        assert c["allreduce_sum_in_place"] == [[[3.0, 3.0]] * 3, True]  # same storage
        assert c["allreduce_int_max"] == [1, 0]
        assert c["broadcast"] == [1.0, 2.0, 3.0, 4.0]
        assert c["broadcast_bf16_in_place"] == [1.0] * 4
        assert c["allgather"] == [[0, 0], [1, 1], [1, 1]]
        assert c["bf16_allreduce"] == [3.0, 3.0]


@pytest.mark.timeout(150)
def test_broadcast_parameters_and_optimizer_state(checks):
    for r in checks:
        b = r["broadcasts"]
        assert b["params_same"] and b["same_object"]
        assert b["lr"] == pytest.approx(0.02)  # rank 1's hyper-parameters
        assert b["adam_steps"] == 1.0  # rank 1's Adam state, on rank 0 too


@pytest.mark.timeout(150)
def test_torch_state_restores_and_syncs_in_place(checks):
    for r in checks:
        s = r["state"]
        assert s["restored"] and s["same_objects"] and s["momentum_kept"]
        assert s["lr"] == pytest.approx(0.05) and s["n"] == 1 and s["extra"] == [1.0] * 3
        # sync adopts the worker with the most commits (rank 1), in place everywhere
        assert s["synced_same"] and s["synced_n"] == 7
        assert s["synced_lr"] == pytest.approx(0.05)


@pytest.mark.timeout(150)
def test_communication_starts_before_backward_ends(checks):
    for r in checks:
        o = r["overlap"]
        # The last piece of backward waited until a bucket's allreduce had begun (it
        # could not have returned otherwise), and a bucket was handed over before the
        # last gradient hook fired.
        assert o["waited_and_overlapped"] and o["first_launch_before_last_hook"]
        assert o["buckets"] > 1


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "case, tolerance", [("sgd", 1e-12), ("accumulate", 1e-12), ("adam", 1e-12), ("fp16", 1e-3)]
)
def test_training_equals_one_process_on_the_global_batch(checks, case, tolerance):
    for r in checks:
        e = r[case]
        assert e["max_diff"] <= tolerance, e
        assert e["identical_every_step"] and e["buckets"] > 1
        assert e["unused_grad_zero"]  # no gradient anywhere: zeros on every rank


@pytest.mark.timeout(120)
def test_worker_lost_mid_bucket_raises_from_step_and_recovers(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    flag = tmp_path / "kill-once"
    flag.write_text("")
    steps = 40
    with ElasticRun(
        [
            "-np",
            "2",
            "--min-np",
            "1",
            "python",
            str(CHECKS),
            str(out),
            "train",
            "--steps",
            str(steps),
            "--kill-flag",
            str(flag),
            "--kill-at",
            "5",
        ],
        tmp_path,
    ) as run:
        assert run.wait(timeout=100) == 0, run.stderr_tail()
        assert len(run.events("worker_failed")) == 1
    assert not flag.exists()  # rank 1 died in step 5's backward
    final = results(out)
    assert final[0]["lost_files"] == ["5"]  # rank 0's step() raised WorkerLostError
    assert len({r["digest"] for r in final}) == 1
    for r in final:
        assert r["steps"] == steps and r["sizes"][0] == 2
        assert r["max_diff"] < 1e-9  # the same as one process, no step lost


def epochs_printed(run: ElasticRun) -> int:
    return run.out_path.read_text().count("test accuracy")


@pytest.mark.chaos
@pytest.mark.long  # CI's torch chaos: the Horovod MNIST example's (ring), the gloo plane's
@pytest.mark.timeout(180)
def test_torch_example_survives_random_sigkills(tmp_path):
    """SIGKILL a random member twice, each time once the world is back to two workers
    and has finished an epoch there (so every kill lands in a live, re-formed job)."""
    record = tmp_path / "record"
    record.mkdir()
    rng = random.Random(13)
    epochs = 30
    with ElasticRun(
        [
            "-np",
            "2",
            "--min-np",
            "1",
            "python",
            str(EXAMPLE),
            "--epochs",
            str(epochs),
            "--record",
            str(record),
            "--loader-workers",
            "2",
        ],
        tmp_path,
    ) as run:
        rounds_at_kill = 0
        for _ in range(2):
            run.wait_event(
                "round_formed", lambda e: e["size"] == 2, timeout=90, after=rounds_at_kill
            )
            seen = epochs_printed(run)
            wait_until(lambda seen=seen: epochs_printed(run) > seen, 90, "an epoch at 2 workers")
            run.kill_member(rng.randrange(2))
            rounds_at_kill = len(run.events("round_formed"))
        assert run.wait(timeout=150) == 0, run.stderr_tail()  # accuracy >= 97% too
        assert len(run.events("worker_failed")) == 2
    final = results(record)
    assert len({r["digest"] for r in final}) == 1, final  # identical parameters
    for r in final:
        assert len(r["epoch_visits"]) == epochs
        assert all(v == [1.0, 1.0] for v in r["epoch_visits"]), r  # every sample once


@pytest.mark.timeout(120)
def test_torch_example_under_mpiexec(tmp_path):
    mpiexec = shutil.which("mpiexec")
    assert mpiexec, "mpiexec is not on PATH (pip install -e .[mpi])"
    run_command(
        [mpiexec, "-n", "2", sys.executable, str(EXAMPLE), "--record", str(tmp_path)], timeout=110
    )
    final = results(tmp_path)
    assert [r["size"] for r in final] == [2, 2]
    assert len({r["digest"] for r in final}) == 1
    assert all(v == [1.0, 1.0] for r in final for v in r["epoch_visits"])


@pytest.mark.timeout(120)
def test_torch_example_alone(tmp_path):
    text = run_command(
        [sys.executable, str(EXAMPLE), "--epochs", "6", "--record", str(tmp_path)], timeout=110
    )
    assert "world size 1" in text
    assert results(tmp_path)[0]["size"] == 1
