"""A job's edges, with real workers and real signals: its last step under failures, a
world replaced whole, the README's examples under chaos, and bad input at the start.

The finish protocol (``docs/DESIGN.md``, "The end"): once a worker's training function
returned having committed the final step, that commit is the job's result; nobody waits
for a finished worker, and a kill after the finish fails nothing.
"""

from __future__ import annotations

import re

import pytest

from tests.support.jobs import (
    ElasticRun,
    check_exact_sum,
    exact_sum_command,
    exact_sum_results,
    hold_at,
    hosts_file_discovery,
    run_cli,
    wait_until,
    write_hosts,
)
from tests.support.paths import ROOT
from tests.support.unwritable import unwritable

SAMPLES, BATCH = 240, 4
DONE = re.compile(r"job done in round \d+ at step (\d+)")


def steps(epochs: int, size: int) -> int:
    return epochs * -(-SAMPLES // (BATCH * size))


@pytest.mark.timeout(120)
def test_a_finished_worker_killed_before_it_exits_fails_nothing(tmp_path):
    """Every worker returned from its training (and wrote its result), then one is
    SIGKILLed before it exits: the finish is the job's result, the job ends 0."""
    out, gate = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    gate.write_text("")
    command = exact_sum_command(out, SAMPLES, 3, "--hold-after", str(gate))
    with ElasticRun(["-np", "3", "--min-np", "2", *command], tmp_path) as run:
        finish = run.wait_event("training_finished", timeout=90)
        wait_until(lambda: len(exact_sum_results(out)) == 3, 30, "every worker's result")
        victim = run.kill_member(1)
        wait_until(
            lambda: any(e["worker"] == victim for e in run.events("worker_failed")),
            30,
            "the victim's exit",
        )
        gate.unlink()
        assert run.wait(timeout=60) == 0, run.stderr_tail()
        failed = [e for e in run.events("worker_failed") if e["worker"] == victim]
        done = run.events("job_done")[-1]
        text = run.stderr_tail(60)
    assert failed[0]["after_finish"] is True
    assert finish["step"] == steps(3, 3) == done["step"]
    # The messages in the order things happened: the finish, then the kill.
    assert text.index("training finished in round") < text.index("ended after the training")
    check_exact_sum(out, SAMPLES, 3, final_size=3, commits=steps(3, 3))


@pytest.mark.timeout(150)
def test_a_loss_at_the_last_step_and_a_replacement_as_the_job_ends(tmp_path):
    """Both members held one step before the end; one is SIGKILLed and training is let
    go at once: the survivor finishes alone or with the replacement the driver starts
    (whichever the store ordered first), and a replacement that comes after the finish
    is told the job is done and exits 0. Never a hang, always exact."""
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    last = steps(2, 2) - 1
    hold_at(gate, last)
    command = exact_sum_command(out, SAMPLES, 2, "--pause-while", str(gate))
    with ElasticRun(["-np", "2", "--min-np", "1", *command], tmp_path) as run:
        run.wait_event("progress", lambda e: e["step"] >= last, timeout=90)
        run.kill_member(1)
        gate.unlink()
        assert run.wait(timeout=100) == 0, run.stderr_tail()
        started = run.events("worker_started")
        exited = run.events("worker_exited")
        output = run.output() + run.err_path.read_text()
    assert len(started) == 3  # the replacement was started
    results = check_exact_sum(out, SAMPLES, 2)
    replacement = started[-1]["worker"]
    if replacement not in {e["worker"] for e in exited}:
        return  # (it was stopped with the job)
    if not any(replacement in str(p) for p in out.iterdir()):
        # It came after the finish: it said so and left with 0, nobody waited for it.
        assert "nothing left to do" in output, output[-2000:]
    assert results


@pytest.mark.timeout(150)
def test_discovery_replacing_every_host_keeps_the_state(tmp_path):
    """The host list goes from one set to a disjoint one (a node pool swap): the old
    workers stay until the newcomers hold the newest commit, then leave at a commit.
    Nothing is rolled back and the result is exact."""
    out = tmp_path / "out"
    out.mkdir()
    script, hosts_file = hosts_file_discovery(tmp_path, "127.0.0.1:2")
    epochs = 10  # 20 ms a step: several seconds, the newcomers start well before the end
    command = exact_sum_command(out, SAMPLES, epochs, "--step-seconds", "0.02")
    with ElasticRun(
        ["--min-np", "2", "--host-discovery-script", str(script), *command], tmp_path
    ) as run:
        run.wait_progress(30)
        write_hosts(hosts_file, "localhost:3")
        assert run.wait(timeout=120) == 0, run.stderr_tail()
        sizes = [e["size"] for e in run.events("round_formed")]
        old = {e["worker"] for e in run.events("worker_started") if e["host"] == "127.0.0.1"}
        left = {e["worker"] for e in run.events("worker_stopped") if e["code"] == 0}
        failed = run.events("worker_failed")
        backs = [e for e in run.events("progress") if e.get("back_from")]
    assert sizes[:3] == [2, 5, 3], sizes  # the old 2 with the new 3, then the new 3
    assert old <= left and not failed  # the old workers left at a commit, with 0
    assert not backs  # no step went back
    # (A member may redo the start of one step, "Draining a host" in docs/DESIGN.md;
    # no committed step is lost: the progress never went back, and the sum is exact.)
    check_exact_sum(out, SAMPLES, epochs, final_size=3)


EXAMPLES = {"train_digits.py": 900, "train_torch_digits.py": 276}


@pytest.mark.chaos
@pytest.mark.timeout(300)
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_readme_examples_under_the_readme_chaos_flag(tmp_path, example):
    """The README's command with its chaos flag, at 1 to 3 s: each run ends 0 and exact
    (the driver's last step and rank 0's are the example's full count). The torch
    example, 4 times longer, runs at the ends of the range only (the suite's time);
    ``benchmarks/chaos_examples.py`` runs each 20 times beside CPU burners."""
    intervals = (1, 3) if example == "train_torch_digits.py" else (1, 2, 3)
    for interval in intervals:
        workdir = tmp_path / f"every-{interval}s"
        args = ["-np", "3", "--min-np", "2", "--chaos-kill-interval", str(interval)]
        args += ["--chaos-max-kills", "20", "python", str(ROOT / "examples" / example)]
        with ElasticRun(args, workdir) as run:
            assert run.wait(timeout=90) == 0, run.stderr_tail()
            done = DONE.search(run.stderr_tail(80))
            rank0 = re.search(r"^\[0\] done: (\d+) steps", run.output(), re.M)
            sizes = [e["size"] for e in run.events("round_formed")]
        assert done and rank0, run.stderr_tail()
        assert int(done.group(1)) == int(rank0.group(1)) == EXAMPLES[example]
        assert min(sizes) >= 2  # never below --min-np


@pytest.mark.parametrize(
    "flag, meant", [("-n", "-np"), ("--min", "--min-np"), ("--chaos-kill", "--chaos-kill-interval")]
)
def test_an_abbreviated_flag_is_refused_naming_the_full_one(flag, meant):
    done = run_cli(flag, "2", "python", "-c", "pass")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and meant in lines[0] and "abbreviations" in lines[0], done.stderr


def test_an_unwritable_checkpoint_dir_is_one_line_and_exit_2(tmp_path):
    with unwritable(tmp_path / "ckpt") as folder:
        done = run_cli("-np", "1", "--checkpoint-dir", str(folder), "python", "-c", "1")
        assert list(folder.iterdir()) == []  # the probe left nothing behind
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and str(folder) in lines[0] and "cannot write" in lines[0]


@pytest.mark.timeout(60)
def test_a_script_that_fails_on_every_worker_is_said_as_the_script_failing(tmp_path):
    """Every worker misses its target and exits 1 after training: the reason names the
    script, whatever the flags (a checkpoint folder included)."""
    script = tmp_path / "misses.py"
    script.write_text(
        "import sys, elastic\n"
        "elastic.init()\n"
        "state = elastic.ObjectState(step=0)\n"
        "@elastic.run\n"
        "def train(state):\n"
        "    while state.step < 20:\n"
        "        elastic.allreduce(1.0)\n"
        "        state.step += 1\n"
        "        state.commit()\n"
        "train(state)\n"
        "sys.exit(1)\n"
    )
    ckpt = tmp_path / "ckpt"
    done = run_cli("-np", "2", "--checkpoint-dir", str(ckpt), "python", str(script))
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "the training script fails" in last, done.stderr
    assert "state was lost" not in last
