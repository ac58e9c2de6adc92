"""Warm spares (``--spares``) with real worker processes: a spare takes a SIGKILLed
member's place and one for a slot discovery adds, a new spare starts behind it, a spare
killed while idle is replaced without the job noticing, and a blacklisted host's spares
are never used. Every job must still train exactly (``exact_sum``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.jobs import (
    ElasticRun,
    check_exact_sum,
    exact_sum_command,
    hosts_file_discovery,
    write_hosts,
)

SAMPLES = 800


def workload(out_dir, epochs, *extra):
    out_dir.mkdir(exist_ok=True)
    return exact_sum_command(out_dir, SAMPLES, epochs, *extra)


@pytest.mark.timeout(120)
def test_a_spare_takes_a_sigkilled_members_place_and_another_starts(tmp_path):
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.write_text("")  # training waits here until the spare took over
    args = ["-np", "2", "--spares", "1", *workload(out, 15, "--pause-while", str(hold))]
    with ElasticRun(args, tmp_path) as run:
        first = run.wait_event("round_formed")
        spare = run.wait_event("spare_ready")
        victim = run.kill_member(1)
        promoted = run.wait_event("spare_promoted")
        assert promoted["worker"] == spare["worker"]
        second = run.wait_event("round_formed", after=1)
        assert second["members"] == [first["members"][0], spare["worker"]]
        assert victim not in second["members"]
        # A new spare started behind it and got ready; no fresh member was started.
        behind = run.wait_event("spare_ready", after=1)
        assert behind["worker"] != spare["worker"]
        started = run.events("worker_started")
        assert [e["spare"] for e in started] == [False, False, True, True]
        hold.unlink()
        assert run.wait(timeout=80) == 0, run.stderr_tail()
        # The spare left behind is no member: it was stopped at the end, not failed.
        assert not [e for e in run.events("worker_failed") if e["worker"] != victim]
    check_exact_sum(out, SAMPLES, 15, final_size=2)


@pytest.mark.timeout(120)
def test_a_spare_takes_the_slot_discovery_adds(tmp_path):
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.write_text("")
    script, hosts_file = hosts_file_discovery(tmp_path, "localhost:2\n")
    args = [
        "--host-discovery-script",
        str(script),
        "--discovery-interval",
        "0.2",
        "--min-np",
        "2",
        "--spares",
        "2",
        *workload(out, 12, "--pause-while", str(hold)),
    ]
    with ElasticRun(args, tmp_path) as run:
        run.wait_event("round_formed", lambda e: e["size"] == 2)
        run.wait_event("spare_ready", after=1)  # both spares are ready
        ready = {e["worker"] for e in run.events("spare_ready")}
        write_hosts(hosts_file, "localhost:4\n")
        grown = run.wait_event("round_formed", lambda e: e["size"] == 4)
        promoted = {e["worker"] for e in run.events("spare_promoted")}
        assert promoted == ready and promoted <= set(grown["members"])
        # Two new spares start behind them (after the refill delay); no fresh member ever.
        run.wait_event("spare_ready", after=3)
        assert [e["spare"] for e in run.events("worker_started")][2:] == [True] * 4
        hold.unlink()
        assert run.wait(timeout=80) == 0, run.stderr_tail()
        assert len(run.events("round_formed")) == 2
    check_exact_sum(out, SAMPLES, 12, final_size=4)


@pytest.mark.timeout(120)
def test_a_spare_killed_while_idle_is_replaced_quietly(tmp_path):
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.write_text("")
    args = ["-np", "2", "--spares", "1", *workload(out, 10, "--pause-while", str(hold))]
    with ElasticRun(args, tmp_path) as run:
        run.wait_event("round_formed")
        spare = run.wait_event("spare_ready")
        os.kill(run.worker_pids()[spare["worker"]], signal.SIGKILL)
        lost = run.wait_event("spare_lost")
        assert lost["worker"] == spare["worker"] and lost["registered"] is True
        again = run.wait_event("spare_ready", after=1)
        assert again["worker"] != spare["worker"]
        hold.unlink()
        assert run.wait(timeout=80) == 0, run.stderr_tail()
        # The job never noticed: one round, no failure, no waiting.
        assert len(run.events("round_formed")) == 1
        assert not run.events("worker_failed") and not run.events("waiting")
    check_exact_sum(out, SAMPLES, 10, final_size=2)


@pytest.mark.timeout(120)
def test_spares_of_a_blacklisted_host_are_not_used(tmp_path):
    """Host b's processes die before ``elastic.init()`` (members and spares alike): b is
    blacklisted, gets no spare while it cools down, and a member lost on a gets a's spare."""
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.write_text("")
    args = [
        "-H",
        "a:1,b:1",
        "-np",
        "1",
        "--min-np",
        "1",
        "--launcher",
        "local",
        "--spares",
        "1",
        "--blacklist-cooldown-range",
        "60",
        "60",
        *workload(out, 12, "--fail-host", "b", "--pause-while", str(hold)),
    ]
    with ElasticRun(args, tmp_path) as run:
        blacklisted = run.wait_event("host_blacklisted", lambda e: e["host"] == "b")
        spare = run.wait_event("spare_ready")
        assert spare["host"] == "a"
        started_by = len(run.events("worker_started"))
        victim = run.kill_member(0)
        promoted = run.wait_event("spare_promoted")
        assert promoted["worker"] == spare["worker"] and promoted["host"] == "a"
        run.wait_event("round_formed", lambda e: victim not in e["members"])
        run.wait_event("spare_ready", after=1)
        hold.unlink()
        assert run.wait(timeout=80) == 0, run.stderr_tail()
        # Nothing started on b once it was blacklisted (the event log is in order).
        events = run.events()
        at = next(i for i, e in enumerate(events) if e == blacklisted)
        late = [e for e in events[at:] if e["kind"] == "worker_started" and e["host"] == "b"]
        assert not late, late
        assert len(run.events("worker_started")) > started_by
        assert not [e for e in run.events("spare_promoted") if e["host"] == "b"]
    check_exact_sum(out, SAMPLES, 12, final_size=1)


def pid_of_worker(host, worker_id: str) -> int:
    """The process of ``worker_id`` on a test host (its pid as seen from here)."""
    for pid in host.pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"ELASTIC_WORKER_ID={worker_id}".encode() in environ:
            return pid
    raise AssertionError(f"no process of {worker_id} on {host}")


@pytest.mark.timeout(150)
def test_each_host_keeps_its_spare_and_a_dead_members_host_promotes_its_own(three_hosts, tmp_path):
    """Across separate hosts (over ssh): one spare per host, and a member SIGKILLed on b
    is replaced by b's spare, never a's (a spare runs where it is)."""
    a, b, _ = three_hosts
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.write_text("")
    args = ["-H", f"{a.address}:1,{b.address}:1", "-np", "2", "--launcher", "ssh"]
    args += ["--spares", "1", *workload(out, 10, "--pause-while", str(hold))]
    with ElasticRun(args, tmp_path, env=three_hosts.env()) as run:
        first = run.wait_event("round_formed")
        run.wait_event("spare_ready", after=1, timeout=60)
        ready = {e["host"]: e["worker"] for e in run.events("spare_ready")}
        assert set(ready) == {a.address, b.address}
        hosts = {e["worker"]: e["host"] for e in run.events("worker_started")}
        (victim,) = [w for w in first["members"] if hosts[w] == b.address]
        os.kill(pid_of_worker(b, victim), signal.SIGKILL)
        promoted = run.wait_event("spare_promoted", timeout=30)
        assert promoted["worker"] == ready[b.address] and promoted["host"] == b.address
        second = run.wait_event("round_formed", after=1, timeout=30)
        assert set(second["members"]) == (set(first["members"]) - {victim}) | {promoted["worker"]}
        hold.unlink()
        assert run.wait(timeout=100) == 0, run.stderr_tail()
    check_exact_sum(out, SAMPLES, 10, final_size=2)
