"""Hung workers with real processes (issue 41, part 2): a worker whose training thread
sleeps for ever while its other threads run is found by its hang watchdog, its stack
names the line in the driver's log, it is killed and replaced within the hang timeout
plus 2 s, and the job is exact; SIGUSR1 to ``elastic-run`` prints every worker's stacks
and changes nothing."""

from __future__ import annotations

import os
import re
import signal

import pytest

from tests.support.jobs import (
    EXACT_SUM,
    ElasticRun,
    check_exact_sum,
    exact_sum_command,
    hold_at,
    wait_until,
)

SAMPLES = 240
HANG_TIMEOUT = 3.0


def hang_line() -> int:
    """The line of ``exact_sum.py`` where its hung training thread sleeps."""
    lines = EXACT_SUM.read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if "# HANG HERE" in line)


@pytest.mark.timeout(90)
def test_a_hung_training_thread_is_named_killed_and_replaced_and_the_job_is_exact(tmp_path):
    out, flag = tmp_path / "out", tmp_path / "hang.flag"
    out.mkdir()
    flag.write_text("")
    command = exact_sum_command(
        out, SAMPLES, 2, "--step-seconds", "0.02", "--hang-flag", str(flag), "--hang-at", "20"
    )
    args = ["-np", "2", "--spares", "1", "--hang-timeout", f"{HANG_TIMEOUT:g}", *command]
    with ElasticRun(args, tmp_path) as run:
        started = run.wait_output(r"hanging after commit \d+ at ([\d.]+)", timeout=60)
        hung_at = float(started.group(1))
        hung = run.wait_event("hung", timeout=HANG_TIMEOUT + 10)
        failed = run.wait_event("worker_failed", lambda e: e["worker"] == hung["worker"])
        second = run.wait_event("round_formed", after=1, timeout=30)
        assert run.wait(timeout=60) == 0, run.stderr_tail()
        line = hang_line()
        # Named, with the line its training thread sleeps on, in the event and the log.
        assert f"exact_sum.py:{line} in hang" in hung["reason"], hung
        assert f'exact_sum.py", line {line}, in hang' in hung["stacks"]
        assert "beside-the-hang" in hung["stacks"]  # every thread, not only the hung one
        stderr = run.err_path.read_text()
        assert f"is hung in round {hung['round']}" in stderr
        assert f'exact_sum.py", line {line}, in hang' in stderr
        # Killed, and the round re-formed without it, within the timeout plus 2 s.
        assert failed["code"] == -signal.SIGKILL
        assert hung["worker"] not in second["members"] and len(second["members"]) == 2
        assert hung["t"] - hung_at <= HANG_TIMEOUT + 2, (hung["t"] - hung_at, hung)
        assert second["t"] - hung_at <= HANG_TIMEOUT + 2, (second["t"] - hung_at, second)
        assert len(run.events("hung")) == 1
        assert not flag.exists()
    check_exact_sum(out, SAMPLES, 2, final_size=2)


@pytest.mark.timeout(90)
def test_sigusr1_prints_every_workers_stacks_and_changes_nothing(tmp_path):
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    hold_at(hold, 10)  # training waits at commit 10 while the test asks for the stacks
    args = ["-np", "2", *exact_sum_command(out, SAMPLES, 2, "--pause-while", str(hold))]
    with ElasticRun(args, tmp_path) as run:
        formed = run.wait_event("round_formed")
        run.wait_progress(10, timeout=60)
        assert run.proc is not None
        os.kill(run.proc.pid, signal.SIGUSR1)

        def dumped():
            text = run.err_path.read_text()
            return "every thread's stack of 2 worker(s)" in text and all(
                re.search(rf'^\[{rank}\]\s+File ".*exact_sum\.py", line \d+ in train', text, re.M)
                for rank in (0, 1)
            )

        wait_until(dumped, 30, f"both workers' stacks; stderr:\n{run.stderr_tail()}")
        stderr = run.err_path.read_text()
        for rank in (0, 1):  # every thread of each, the runtime's own included
            assert re.search(rf"^\[{rank}\]\s+Thread 0x", stderr, re.M), stderr[-3000:]
        hold.unlink()
        assert run.wait(timeout=60) == 0, run.stderr_tail()
        # Nothing changed: one round, nobody failed or was killed, no hang said.
        assert [e["round"] for e in run.events("round_formed")] == [formed["round"]]
        assert not run.events("worker_failed") and not run.events("hung")
    check_exact_sum(out, SAMPLES, 2, final_size=2)
