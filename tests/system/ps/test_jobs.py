"""Parameter-server shards under ``elastic-run --num-ps``: supervised, restarted from
checkpoints after SIGKILL (or empty without a checkpoint dir), and resumed by a new job
from the checkpoint dir."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.support.jobs import ROOT, WORKLOADS, ElasticRun, wait_until

PS_LINEAR = WORKLOADS / "ps_linear.py"
PS_EXAMPLE = ROOT / "examples" / "train_ps_digits.py"


def ps_results(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def check_converged(out: Path, steps: int) -> list[dict]:
    results = ps_results(out)
    assert results
    for r in results:
        assert r["step"] >= steps
        assert r["loss"] < 1e-3 * r["initial_loss"], r
    return results


def shard_pid(run: ElasticRun, index: int) -> int:
    return [e for e in run.events("ps_started") if e["shard"] == index][-1]["pid"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_killed_shard_is_restarted_from_its_checkpoint(tmp_path, mode):
    out = tmp_path / "out"
    out.mkdir()
    ckpt = tmp_path / "ckpt"
    hold = tmp_path / "hold"  # while it exists the workers wait between steps
    args = [
        "-np",
        "2",
        "--min-np",
        "1",
        "--num-ps",
        "2",
        "--ps-mode",
        mode,
        "--ps-checkpoint-dir",
        str(ckpt),
        "--ps-checkpoint-interval",
        "0.3",
        "python",
        str(PS_LINEAR),
        str(out),
        "--steps",
        "400",
        "--pause-while",
        str(hold),
    ]
    with ElasticRun(args, tmp_path) as run:
        run.wait_event("checkpoint_written", timeout=60)
        hold.write_text("")  # however fast training is, the kills land before its end
        os.kill(shard_pid(run, 1), signal.SIGKILL)
        restarted = run.wait_event("ps_restarted", lambda e: e["shard"] == 1)
        # Said with what it loses: the updates after the newest checkpoint the driver
        # heard of (the same or a newer one than the first).
        (first, *_) = run.events("checkpoint_written")
        assert restarted["checkpoint"] >= first["checkpoint"], restarted
        assert restarted["step"] >= first["step"], restarted
        line = (
            f"ps shard 1 restarted from checkpoint {restarted['checkpoint']} at step "
            f"{restarted['step']}: what it applied after step {restarted['step']} is lost"
        )
        stderr = tmp_path / "stderr.log"
        wait_until(lambda: line in stderr.read_text(), 10, f"the restart's line: {line}")
        rounds = len(run.events("round_formed"))
        run.kill_member(0)  # and a worker: no applied update is lost, the job goes on
        run.wait_event("round_formed", after=rounds)
        hold.unlink()
        assert run.wait(timeout=100) == 0, run.stderr_tail()
        assert len(run.events("ps_started")) == 3
    check_converged(out, 400)


def _each_saw(out: Path, workers: int, step: int) -> bool:
    """Whether ``workers`` workers each recorded a step of at least ``step``."""
    seen = []
    for steps_file in out.glob("*.steps"):
        lines = steps_file.read_text().split()
        seen.append(bool(lines) and int(lines[-1]) >= step)
    return len(seen) == workers and all(seen)


@pytest.mark.timeout(90)
def test_a_shard_killed_without_a_checkpoint_gets_its_variables_back_and_training_goes_on(
    tmp_path,
):
    """No --ps-checkpoint-dir and one shard: SIGKILLed mid-run, it restarts empty, each
    worker re-creates the variables from its init() values, and training goes on to the
    end (the re-create once waited forever on the client's only shard thread)."""
    out = tmp_path / "out"
    out.mkdir()
    hold = tmp_path / "hold"  # while it exists the workers wait between steps
    args = [
        *("-np", "2", "--num-ps", "1", "python", str(PS_LINEAR), str(out)),
        *("--steps", "100", "--pause-while", str(hold), "--record-steps"),
    ]
    with ElasticRun(args, tmp_path) as run:
        # Each worker has seen step 20 applied (rank 0's progress alone is not enough:
        # under load the other worker may still be at its first pushes).
        wait_until(lambda: _each_saw(out, 2, 20), 60, "each worker at step 20")
        hold.write_text("")  # the kill lands mid-run, however fast training is
        killed = shard_pid(run, 0)
        os.kill(killed, signal.SIGKILL)
        run.wait_event("ps_started", lambda e: e["pid"] != killed)
        hold.unlink()
        assert run.wait(timeout=60) == 0, run.stderr_tail()
    log = (tmp_path / "stderr.log").read_text()
    assert "ps shard 0 lost its variables; re-creating them from init()" in log, log
    # The driver says the restart with what it loses: everything, since step 0.
    assert (
        "ps shard 0 restarted empty (no checkpoint: no --ps-checkpoint-dir): its state "
        "since step 0 is lost" in log
    ), log
    # The variables start again from init(): the step goes back. The worker that
    # re-creates them first sees it; the other may resume only after the step passed
    # its own last one (then it sees no step go back, but goes on to the end too).
    resets = []
    for steps_file in out.glob("*.steps"):
        steps = [int(line) for line in steps_file.read_text().split()]
        assert steps[-1] >= 100, steps
        back = [i for i in range(1, len(steps)) if steps[i] < steps[i - 1]]
        resets += [steps[i - 1] for i in back]
    assert resets and min(resets) >= 20, resets  # went on from the start, once it was 20+
    assert len(ps_results(out)) == 2


@pytest.mark.timeout(120)
def test_new_job_resumes_from_the_checkpoint_dir(tmp_path):
    ckpt = tmp_path / "ckpt"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    common = [
        "-np",
        "2",
        "--num-ps",
        "2",
        "--ps-checkpoint-dir",
        str(ckpt),
        "--ps-checkpoint-interval",
        "0.2",
        "python",
        str(PS_LINEAR),
    ]
    with ElasticRun([*common, str(first), "--steps", "200"], tmp_path / "run1") as run:
        assert run.wait(timeout=100) == 0, run.stderr_tail()
        checkpoints = run.events("checkpoint_written")
    assert checkpoints
    saved = max(e["step"] for e in checkpoints)
    with ElasticRun([*common, str(second), "--steps", "300"], tmp_path / "run2") as run:
        assert run.wait(timeout=100) == 0, run.stderr_tail()
    results = check_converged(second, 300)
    assert all(r["first_step"] >= saved for r in results), (saved, results)


@pytest.mark.long  # ps workers killed mid-run: tests/ps/test_training.py in CI
@pytest.mark.timeout(120)
def test_the_ps_example_trains_the_digits_through_a_killed_worker(tmp_path):
    """The README's ps example as a user runs it (2 workers, 2 shards, sync): a worker
    SIGKILLed mid-run is replaced, and the model still reaches its accuracy target
    (the example exits 1 below it)."""
    args = ["-np", "2", "--num-ps", "2", "--ps-mode", "sync", "python", str(PS_EXAMPLE)]
    with ElasticRun(args, tmp_path) as run:
        run.wait_event("round_formed")  # training has begun
        run.kill_member(1)
        assert run.wait(timeout=100) == 0, run.stderr_tail()
        assert len(run.events("round_formed")) >= 2
    done = [line for line in (tmp_path / "stdout.log").read_text().splitlines() if "done:" in line]
    assert done and "test accuracy" in done[0], done
