"""The driver with real worker processes: replacement, blacklisting, unresponsive workers,
signals, exit status, and every kind of bad input. Both stores where the store matters."""

from __future__ import annotations

import os
import re
import shlex
import signal

import pytest

from tests.support.jobs import (
    EXACT_SUM,
    ROOT,
    WORKLOADS,
    ElasticRun,
    check_exact_sum,
    hosts_file_discovery,
    pid_alive,
    run_cli,
    wait_until,
    write_hosts,
    write_whole,
)

SAMPLES = 800


def workload(out_dir, epochs=10, *extra):
    return [
        "python",
        str(EXACT_SUM),
        str(out_dir),
        "--samples",
        str(SAMPLES),
        "--epochs",
        str(epochs),
        "--batch",
        "4",
        *extra,
    ]


def ssh_env(sshd_server) -> dict[str, str]:
    """The environment that points elastic-run's ssh at the test's sshd."""
    settings = sshd_server.settings()
    options = [
        "-p",
        str(settings.port),
        "-i",
        settings.identity_file,
        "-l",
        settings.user,
        *settings.extra_options,
    ]
    return {"ELASTIC_SSH_OPTIONS": shlex.join(options)}


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["-np", "2", "--min-np", "3", "--max-np", "4", "python", "x.py"], "--min-np"),
        (["-np", "2"], "COMMAND"),
        (
            ["-np", "2", "--host-discovery-script", "/nonexistent/discover.sh", "true"],
            "discover.sh",
        ),
        (
            ["-np", "2", "--blacklist-cooldown-range", "10", "5", "true"],
            "--blacklist-cooldown-range",
        ),
        (["-np", "2", "-H", "host:x", "true"], "host:x"),
        (["-np", "2", "--rendezvous", "etcd://nohost", "true"], "etcd://nohost"),
        (["-np", "0", "true"], "-np"),
        (["-np", "99999999999999999999", "true"], "-np"),
        (["-H", "localhost:99999999999999999999999", "true"], "localhost:999"),
        (["-np", "2", "--ps-mode", "sync", "true"], "--ps-mode needs --num-ps"),
        (["-np", "2", "--ps-checkpoint-dir", "/tmp", "true"], "--ps-checkpoint-dir"),
        (["-np", "1", "--log-dir", "/dev/null/x", "true"], "--log-dir /dev/null/x"),
        (["-np", "1", "--events", "/nonexistent-dir/e.jsonl", "true"], "--events"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args, fragment):
    result = run_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ELASTIC_PEER_TIMEOUT", "1e-9"),
        ("ELASTIC_CONNECT_TIMEOUT", "abc"),
        ("ELASTIC_LEASE_TTL", "-1"),
    ],
)
def test_a_bad_tuning_variable_is_one_line_before_any_worker_starts(variable, value):
    result = run_cli("-np", "1", "true", env={variable: value})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{variable}={value!r}" in lines[0] and "use " in lines[0], lines


def test_non_executable_discovery_script_is_refused(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost\n")
    result = run_cli("-np", "1", "--host-discovery-script", str(script), "true")
    assert result.returncode == 2 and "executable" in result.stderr


def test_bad_discovery_line_at_start_names_the_line(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\necho 'bad host:x'\n")
    script.chmod(0o755)
    result = run_cli("-np", "1", "--host-discovery-script", str(script), "true")
    assert result.returncode == 1
    assert "line 2" in result.stderr and "bad host:x" in result.stderr, result.stderr


def test_unreachable_etcd_fails_fast_with_one_line():
    from tests.support.etcd_cluster import free_ports

    result = run_cli("-np", "1", "--rendezvous", f"etcd://127.0.0.1:{free_ports(1)[0]}", "true")
    assert result.returncode == 1 and "cannot reach" in result.stderr, result.stderr


@pytest.mark.timeout(90)
def test_sigkilled_worker_is_replaced_in_its_slot(tmp_path, store_args):
    out = tmp_path / "out"
    out.mkdir()
    with ElasticRun(["-np", "2", *store_args, *workload(out, 15)], tmp_path) as run:
        run.wait_progress(30)
        victim = run.kill_member(1)
        assert run.wait(timeout=80) == 0, run.stderr_tail()
        started = run.events("worker_started")
        slot = next(e["slot"] for e in started if e["worker"] == victim)
        replacement = [e for e in started if e["slot"] == slot][-1]
        assert replacement["worker"] != victim
        assert replacement["worker"] in run.members()
        said = run.err_path.read_text()
        assert "WARNING" not in said, said  # an ordinary end (the agents' too) is quiet
    check_exact_sum(out, SAMPLES, 15, final_size=2)


@pytest.mark.timeout(90)
# The blacklist is the driver's (driver.policy): the embedded store in CI, etcd's run
# with -m long (the suite's 15 minutes)
@pytest.mark.parametrize(
    "store_args",
    ["embedded", pytest.param("etcd", marks=pytest.mark.long)],
    indirect=True,
)
def test_failing_host_is_blacklisted_and_comes_back(tmp_path, store_args):
    out = tmp_path / "out"
    out.mkdir()
    flag = tmp_path / "broken"
    flag.write_text("")
    hold = tmp_path / "hold"
    hold.write_text("")  # training waits until the host is back, however fast it would be
    args = [
        "-H",
        "localhost:1,127.0.0.1:1",
        "-np",
        "1",
        "--min-np",
        "1",
        "--launcher",
        "local",
        "--blacklist-cooldown-range",
        "1",
        "2",
        *store_args,
        *workload(
            out,
            30,
            "--fail-host",
            "127.0.0.1",
            "--fail-flag",
            str(flag),
            "--pause-while",
            str(hold),
        ),
    ]
    with ElasticRun(args, tmp_path) as run:
        blacklisted = run.wait_event("host_blacklisted", lambda e: e["host"] == "127.0.0.1")
        flag.unlink()  # the host is repaired
        run.wait_event("host_back", lambda e: e["host"] == "127.0.0.1")
        run.wait_event("round_formed", lambda e: e["size"] == 2)
        hold.unlink()
        assert run.wait(timeout=80) == 0, run.stderr_tail()
        failures = [e for e in run.events("worker_failed") if e["host"] == "127.0.0.1"]
        assert len(failures) >= 3 and blacklisted["cooldown"] <= 2
        # localhost was never blacklisted: its worker kept training throughout.
        assert not [e for e in run.events("host_blacklisted") if e["host"] == "localhost"]
    check_exact_sum(out, SAMPLES, 30, final_size=2)


@pytest.mark.timeout(90)
def test_stopped_worker_is_declared_lost_and_replaced(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with ElasticRun(
        ["-np", "3", "--min-np", "2", *workload(out, 25)],
        tmp_path,
        env={"ELASTIC_PEER_TIMEOUT": "2"},
    ) as run:
        run.wait_progress(30)
        victim = run.kill_member(2, signal.SIGSTOP)
        report = run.wait_event("failure_reported", lambda e: e.get("suspect") == victim)
        failed = run.wait_event("worker_failed", lambda e: e["worker"] == victim)
        # The driver says it killed the worker, and why (not "killed by SIGKILL" alone).
        # ... after its peers' word was confirmed by its own silence.
        assert failed["reason"].startswith("killed by the driver: unresponsive: reported by ")
        assert failed["reason"].endswith("it reported nothing itself for 2 s")
        assert run.wait(timeout=80) == 0, run.stderr_tail()
        assert report["suspect"] == victim
        text = run.err_path.read_text()
        assert "failed (killed by SIGKILL): killed by the driver: unresponsive" in text
    check_exact_sum(out, SAMPLES, 25)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_elastic_run_stops_everything(tmp_path, sig):
    out = tmp_path / "out"
    out.mkdir()
    with ElasticRun(["-np", "2", *workload(out, 200)], tmp_path) as run:
        run.wait_progress(20)
        pids = list(run.worker_pids().values())
        run.proc.send_signal(sig)
        code = run.wait(timeout=30)
        assert code == 128 + sig  # stopped, not failed
        assert "stopped by" in run.stderr_tail() and not run.events("job_failed")
        wait_until(lambda: not any(pid_alive(p) for p in pids), 10, "workers to be gone")


@pytest.mark.timeout(60)
def test_a_discovery_script_running_when_the_job_stops_does_not_outlive_it(tmp_path):
    """SIGTERM while the script's second run hangs (with a child of its own): the
    driver stops, and neither the script nor its child is left behind."""
    out = tmp_path / "out"
    out.mkdir()
    first, child_pid = tmp_path / "first-run", tmp_path / "child.pid"
    script = tmp_path / "discover.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"if [ -e {first} ]; then sleep 300 & echo $! > {child_pid}.new; "
        f"mv {child_pid}.new {child_pid}; wait; fi\n"
        f"touch {first}\necho localhost:2\n"
    )
    script.chmod(0o755)
    found = ("--host-discovery-script", str(script), "--discovery-interval", "0.2")
    with ElasticRun([*found, "-np", "2", *workload(out, 200)], tmp_path) as run:
        wait_until(child_pid.exists, 30, "the script's second run")
        child = int(child_pid.read_text())
        assert run.proc is not None
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait(timeout=30) == 128 + signal.SIGTERM
        wait_until(lambda: not pid_alive(child), 10, "the script's child to be gone")


@pytest.mark.timeout(90)
def test_a_worker_finishing_early_is_not_job_success(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with ElasticRun(
        ["-np", "3", "--min-np", "2", *workload(out, 20, "--exit-slot", "2", "--exit-at", "40")],
        tmp_path,
    ) as run:
        assert run.wait(timeout=80) == 0, run.stderr_tail()
        early = [e for e in run.events("worker_exited") if e["slot"] == 2]
        assert early, "the worker on slot 2 should have exited early"
        final = run.current_round()
        assert final["size"] == 2 and early[0]["worker"] not in final["members"]
    # The others trained on without it to the end, exactly.
    check_exact_sum(out, SAMPLES, 20, final_size=2)


@pytest.mark.timeout(60)
def test_reset_limit_ends_the_job_with_a_reason(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with ElasticRun(
        ["-np", "2", "--min-np", "1", "--reset-limit", "1", *workload(out, 200)], tmp_path
    ) as run:
        run.wait_progress(20)
        run.kill_member(1)
        run.wait_event("round_formed", lambda e: e["round"] == 2)
        run.wait_progress(run.progress + 10)
        run.kill_member(0)
        assert run.wait(timeout=40) == 1
        assert "reset limit" in run.stderr_tail()


@pytest.mark.timeout(60)
def test_elastic_timeout_when_too_few_slots_remain(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script, hosts = hosts_file_discovery(tmp_path, "localhost:2\n")
    with ElasticRun(
        [
            "-np",
            "2",
            "--min-np",
            "2",
            "--host-discovery-script",
            str(script),
            "--discovery-interval",
            "0.2",
            "--elastic-timeout",
            "2",
            *workload(out, 200),
        ],
        tmp_path,
    ) as run:
        run.wait_progress(20)
        write_hosts(hosts, "localhost:1\n")
        assert run.wait(timeout=40) == 1
        assert "--elastic-timeout" in run.stderr_tail()


@pytest.mark.timeout(90)
def test_ssh_launcher_runs_a_job_through_a_real_sshd(tmp_path, sshd_server):
    """Workers started through ssh (a real sshd on loopback) train and finish exactly."""
    out = tmp_path / "out"
    out.mkdir()
    with ElasticRun(
        ["-H", "127.0.0.1:2", "--launcher", "ssh", *workload(out, 10)],
        tmp_path,
        env=ssh_env(sshd_server),
    ) as run:
        run.wait_progress(20)
        run.kill_member(1)  # kills the local ssh client; the remote worker goes with it
        assert run.wait(timeout=80) == 0, run.stderr_tail()
    check_exact_sum(out, SAMPLES, 10, final_size=2)


@pytest.mark.timeout(60)
def test_single_worker_crash_is_replaced(tmp_path):
    """-np 1: a failed worker is replaced (its exit code alone does not end the job).
    Nobody holds what it committed, so with ``--on-state-lost restart`` its replacement
    starts over, and the job says so, naming the step lost (held at commit 50 until
    the driver knows of it, then crashing at 51)."""
    out, flag, gate = tmp_path / "out", tmp_path / "crash", tmp_path / "gate"
    out.mkdir()
    flag.write_text("")
    write_whole(gate, "50")
    args = [
        *("-np", "1", "--on-state-lost", "restart", "--progress-interval", "0.2"),
        *workload(out, 5, "--crash-flag", str(flag), "--crash-at", "51"),
        *("--pause-while", str(gate)),
    ]
    with ElasticRun(args, tmp_path) as run:
        run.wait_event("progress", lambda e: e["step"] >= 50, timeout=30)
        gate.unlink()
        assert run.wait(timeout=50) == 0, run.stderr_tail()
        assert [e["code"] for e in run.events("worker_failed")] == [5]
        (lost,) = run.events("state_lost")
        # 51 only when rank 0 published the last commit in the instant before it crashed.
        assert (lost["round"], lost["previous"]) == (2, 1) and lost["step"] in (50, 51), lost
    check_exact_sum(out, SAMPLES, 5, final_size=1)


@pytest.mark.timeout(60)
def test_script_failing_everywhere_ends_the_job(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import elastic\nelastic.init()\nraise SystemExit(3)\n")
    with ElasticRun(["-np", "2", "python", str(script)], tmp_path) as run:
        assert run.wait(timeout=50) == 1
        assert "the training script fails" in run.stderr_tail()


@pytest.mark.timeout(60)
def test_workers_dying_before_any_round_end_the_job(tmp_path):
    with ElasticRun(["-np", "1", "python", "-c", "raise SystemExit(4)"], tmp_path) as run:
        assert run.wait(timeout=50) == 1
        assert "failed in a row" in run.stderr_tail()


@pytest.mark.timeout(60)
def test_a_script_that_never_joins_is_told_to_call_elastic_init(tmp_path):
    with ElasticRun(["-np", "2", "python", "-c", "print('trained alone')"], tmp_path) as run:
        assert run.wait(timeout=50) == 1
        assert "does the script call elastic.init()" in run.stderr_tail()


@pytest.mark.timeout(60)
def test_workers_and_shards_do_not_outlive_a_killed_driver(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with ElasticRun(["-np", "2", "--num-ps", "1", *workload(out, 200)], tmp_path) as run:
        run.wait_progress(20)
        pids = list(run.worker_pids().values()) + [e["pid"] for e in run.events("ps_started")]
        run.proc.send_signal(signal.SIGKILL)  # no chance to stop anything itself
        run.wait(timeout=10)
        wait_until(
            lambda: not any(pid_alive(p) for p in pids), 15, "orphaned workers and shards to stop"
        )


@pytest.mark.timeout(60)
def test_only_a_blacklisted_host_left_waits_for_its_cooldown(tmp_path):
    """Discovery leaves only a host that is cooling down: the job waits for it to come
    back (it does within --elastic-timeout) instead of failing at once."""
    out = tmp_path / "out"
    out.mkdir()
    flag = tmp_path / "broken"
    flag.write_text("")
    hold = tmp_path / "hold"
    hold.write_text("")
    script, hosts = hosts_file_discovery(tmp_path, "localhost:1\n127.0.0.1:1\n")
    args = [
        "-np",
        "1",
        "--min-np",
        "1",
        "--host-discovery-script",
        str(script),
        "--discovery-interval",
        "0.2",
        "--launcher",
        "local",
        "--blacklist-cooldown-range",
        "2",
        "2",
        "--elastic-timeout",
        "30",
        *workload(
            out,
            10,
            "--fail-host",
            "127.0.0.1",
            "--fail-flag",
            str(flag),
            "--pause-while",
            str(hold),
        ),
    ]
    with ElasticRun(args, tmp_path) as run:
        run.wait_event("host_blacklisted", lambda e: e["host"] == "127.0.0.1")
        flag.unlink()
        write_hosts(hosts, "127.0.0.1:1\n")  # the good host leaves; only the cooling one stays
        run.wait_event("host_back", lambda e: e["host"] == "127.0.0.1")
        run.wait_event("round_formed", lambda e: e["members"][0].startswith("127.0.0.1"))
        hold.unlink()
        assert run.wait(timeout=50) == 0, run.stderr_tail()
    check_exact_sum(out, SAMPLES, 10, final_size=1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "line, problem",
    [
        ("localhost:99999999999999999999999", "at most 1024 per host"),
        ("h" * 300 + ":2", "DNS allows 253"),
    ],
    ids=["huge-slots", "long-name"],
)
def test_absurd_discovery_line_is_a_prompt_one_line_error(tmp_path, line, problem):
    """The driver neither spins nor grows: it names the line and exits at once."""
    script, _ = hosts_file_discovery(tmp_path, f"{line}\n")
    result = run_cli("-np", "1", "--host-discovery-script", str(script), "true", timeout=20)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "line 1" in lines[0] and problem in lines[0], result.stderr


@pytest.mark.timeout(90)
def test_local_launcher_takes_made_up_host_names_as_labels(tmp_path):
    """--launcher local with hosts that do not resolve: every worker runs here, binds and
    advertises loopback, and the ring of two "hosts" connects over 127.0.0.1."""
    out = tmp_path / "out"
    out.mkdir()
    args = ["-H", "a:2,b:2", "--launcher", "local", *workload(out, 4)]
    with ElasticRun(args, tmp_path) as run:
        assert run.wait(timeout=80) == 0, run.stderr_tail()
        assert {e["host"] for e in run.events("worker_started")} == {"a", "b"}
        assert "gaierror" not in run.err_path.read_text()
    results = check_exact_sum(out, SAMPLES, 4, final_size=4)
    assert all(r["rank"] in range(4) for r in results)


@pytest.mark.timeout(60)
def test_a_ps_script_without_shards_fails_at_once_with_the_reason(tmp_path):
    """The driver publishes that the job runs no shards: ``elastic.ps.connect()`` raises
    at once, naming the flag, instead of waiting for shards that never come."""
    out = tmp_path / "out"
    out.mkdir()
    script = WORKLOADS / "ps_linear.py"
    with ElasticRun(["-np", "1", "python", str(script), str(out)], tmp_path) as run:
        assert run.wait(timeout=50) == 1
        output = run.out_path.read_text() + run.err_path.read_text()
        assert "this job runs no parameter-server shards" in output, output[-2000:]
        assert "--num-ps" in output
        failed = run.events("job_failed")[0]
        assert failed["seconds"] < 15  # two short tries, not a shard wait of 10 s each


# ----------------------------------------------------------------------------- what failed


@pytest.mark.timeout(60)
def test_a_program_that_does_not_exist_ends_the_job_at_once(tmp_path):
    with ElasticRun(["-np", "2", "./nonexistent"], tmp_path) as run:
        assert run.wait(timeout=30) == 1
        last = run.stderr_tail().splitlines()[-1]
        assert "cannot start './nonexistent': No such file or directory" in last, last
        # The driver's own lines carry the time.
        assert re.match(r"elastic-run \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]: job failed: ", last)
        assert len(run.events("worker_failed")) <= 2  # no relaunch loop
        assert run.events("job_failed")[0]["seconds"] < 10


@pytest.mark.timeout(90)
def test_over_ssh_a_missing_program_is_named_with_its_host(tmp_path, sshd_server):
    """The host's agent starts the program itself (no shell between): the error is the
    exec's own, naming the program and the host's slot, and no try would do better."""
    with ElasticRun(
        ["-H", "127.0.0.1:2", "--launcher", "ssh", "./nonexistent"],
        tmp_path,
        env=ssh_env(sshd_server),
    ) as run:
        assert run.wait(timeout=60) == 1
        last = run.stderr_tail().splitlines()[-1]
        assert "cannot start './nonexistent': No such file or directory" in last, last
        assert "(for 127.0.0.1:" in last
        assert len(run.events("worker_failed")) <= 2


@pytest.mark.timeout(60)
def test_discovery_listing_no_hosts_is_said_at_once_and_again(tmp_path):
    script, _ = hosts_file_discovery(tmp_path, "# nothing yet\n")
    args = ["-np", "1", "--host-discovery-script", str(script), "--start-timeout", "6", "true"]
    with ElasticRun(args, tmp_path) as run:
        assert run.wait(timeout=40) == 1
        waits = run.events("waiting")
        assert len(waits) >= 2 and all("lists none" in w["what"] for w in waits)
        assert waits[0]["elapsed"] < 3 and waits[1]["waited"] >= 5
        last = run.stderr_tail().splitlines()[-1]
        assert "discovery has listed no host" in last and "only 0 of" not in last, last


END_FAILURE = """\
import os, sys, time
import numpy as np
import elastic

elastic.init()
state = elastic.ObjectState(step=0)

@elastic.run
def train(state):
    while state.step < 20:
        elastic.allreduce(np.ones(1))
        state.step += 1
        state.commit()

train(state)
if os.environ["ELASTIC_SLOT"] in sys.argv[1].split(","):
    # The thing under test: this worker fails only after a delay, when the others have
    # finished (no condition to wait on inside the worker: the driver must cope).
    time.sleep(float(sys.argv[2]))
    os.abort()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "failing, extra, reason",
    [
        # The finish is the job's result: a crash after it is the script's end failing,
        # said once, with no relaunch (docs/DESIGN.md, "The end").
        ("0,1", [], "the training script fails: every worker of round 1"),
        ("1", ["--min-np", "1"], "(killed by SIGABRT) after the training finished"),
    ],
    ids=["every-worker", "after-the-others-finished"],
)
def test_a_worker_failing_at_its_end_is_not_relaunched_again_and_again(
    tmp_path, failing, extra, reason
):
    script = tmp_path / "end_failure.py"
    script.write_text(END_FAILURE)
    pause = "0" if failing == "0,1" else "3"
    args = ["-np", "2", *extra, "python", str(script), failing, pause]
    with ElasticRun(args, tmp_path) as run:
        assert run.wait(timeout=50) == 1
        last = run.stderr_tail().splitlines()[-1]
        assert reason in last, last
        assert len(run.events("worker_failed")) <= 6


SLOW_SHARD = """\
import sys, time
if "--num-shards" in sys.argv:  # a ps shard (python -m ps.server ...)
    time.sleep(120)  # the thing under test: a shard that never becomes ready
"""


@pytest.mark.timeout(60)
def test_sigterm_while_ps_shards_start_is_honoured_at_once(tmp_path):
    """The shards take longer to start than the user waits: SIGTERM ends the job now,
    not after --start-timeout."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_SHARD)
    args = ["-np", "1", "--num-ps", "1", "--start-timeout", "100", "python", "-c", "pass"]
    env = {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    with ElasticRun(args, tmp_path, env=env) as run:
        run.wait_event("job_started", timeout=20)
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait(timeout=20) == 128 + signal.SIGTERM
        stopped = run.events("job_stopped")[0]
        assert "stopped by SIGTERM while the ps shards started" in stopped["reason"]


# ----------------------------------------------------------------------------- a driver that talks


@pytest.mark.long  # 16 s; CI's etcd outage: the chaos run that kills and restarts etcd
@pytest.mark.timeout(120)
def test_an_etcd_outage_is_said_at_once_again_and_when_it_ends(tmp_path, etcd_single):
    """etcd SIGKILLed mid-run for about 7 s: the driver says so at once, again every few
    seconds, and when it is back; training goes on and ends exact."""
    import uuid

    out = tmp_path / "out"
    out.mkdir()
    hold = tmp_path / "hold"
    hold.write_text("")
    args = [
        "-np",
        "2",
        "--rendezvous",
        etcd_single.url,
        "--job-id",
        f"t{uuid.uuid4().hex[:10]}",
        *workload(out, 10, "--pause-while", str(hold)),
    ]
    with ElasticRun(args, tmp_path) as run:
        run.wait_event("round_formed")
        etcd_single.kill(0)
        first = run.wait_event("store_unreachable", timeout=15)
        assert first["seconds"] == 0 and first["error"]
        again = run.wait_event("store_unreachable", lambda e: e["seconds"] >= 5, timeout=15)
        etcd_single.restart(0)
        back = run.wait_event("store_back", timeout=30)
        assert back["seconds"] >= again["seconds"]
        hold.unlink()
        assert run.wait(timeout=60) == 0, run.stderr_tail()
        text = run.err_path.read_text()
        assert "the rendezvous store is unreachable (0.00s so far)" in text
        assert "the rendezvous store is back after" in text
    check_exact_sum(out, SAMPLES, 10, final_size=2)


@pytest.mark.timeout(90)
def test_progress_lines_and_events_for_a_collective_job(tmp_path, etcd_server):
    """Rank 0 publishes its step every ``progress_period`` (here the interval: one
    store write per interval, never one per step); the driver says it every interval."""
    import uuid

    from rendezvous import open_store
    from rendezvous.keys import JobKeys
    from rendezvous.schema.workers import ProgressRecord

    out = tmp_path / "out"
    out.mkdir()
    job_id = f"t{uuid.uuid4().hex[:10]}"
    store_args = ["--rendezvous", etcd_server.url, "--job-id", job_id]
    args = ["-np", "2", *store_args, "--progress-interval", "0.5", *workload(out, 1000)]
    with ElasticRun(args, tmp_path) as run:
        run.wait_event("progress", after=3, timeout=60)
        with open_store(etcd_server.url) as store:
            kv = store.get(JobKeys(job_id).progress)
        elapsed = run.events("progress")[-1]["elapsed"] - run.events("round_formed")[0]["elapsed"]
        assert kv.version <= elapsed / 0.5 + 2 < ProgressRecord.from_json(kv.value).step
        progress = run.events("progress")
        assert all(p["round"] == 1 and p["size"] == 2 for p in progress)
        steps = [p["step"] for p in progress]
        assert steps == sorted(steps) and steps[-1] > steps[0] > 0
        assert progress[0]["steps_per_second"] is None
        assert any(p["steps_per_second"] for p in progress[1:])
        assert "progress: round 1, 2 workers, step " in run.err_path.read_text()


@pytest.mark.timeout(60)
def test_progress_interval_0_says_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    args = ["-np", "1", "--progress-interval", "0", *workload(out, 60)]
    with ElasticRun(args, tmp_path) as run:
        assert run.wait(timeout=50) == 0, run.stderr_tail()
        assert run.events("progress") == []
