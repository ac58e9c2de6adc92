"""Operations on whole jobs across separate test hosts (``tests/support/hosts/netns.py``):
a remote worker SIGKILLed, hosts added and removed by the discovery script, and a
parameter-server shard's host cut off the network. Each job finishes correct to the bit
(``exact_sum``) or converged at its exact step count (``ps_linear``), and nothing of the
job is left running on any host afterwards.

Training is held at known commit counts (``hold_at``), so every change lands mid-run
however fast or slow the machine is.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import pytest

from tests.support.jobs import (
    EXACT_SUM,
    ElasticRun,
    check_exact_sum,
    exact_sum_command,
    hold_at,
    hosts_file_discovery,
    wait_until,
    write_hosts,
)
from tests.system.faults.test_chaos import EPOCHS, SAMPLES
from tests.system.hosts.test_multihost import store_args, workload
from tests.system.ps.test_jobs import PS_LINEAR, check_converged

pytestmark = pytest.mark.chaos

STORES = ["embedded", "etcd"]


def nothing_left(*hosts) -> None:
    """Every process of the job has ended on ``hosts`` (within a bound); if not, the
    error names what still runs."""
    try:
        wait_until(lambda: not any(h.pids() for h in hosts), 30, "the job's processes to end")
    except AssertionError:
        left = {h.address: [command_line(p) for p in h.pids()] for h in hosts}
        raise AssertionError(f"processes left on the hosts: {left}") from None


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(gone)"


@contextlib.contextmanager
def job_store(store: str, hosts, tmp_path) -> Iterator[list[str]]:
    """``store_args`` for the test's life: the etcd member (if any) stops after it."""
    extra, cluster = store_args(store, hosts, tmp_path)
    try:
        yield extra
    finally:
        if cluster is not None:
            cluster.stop()


def fresh_member(run: ElasticRun, host, old: list[str]) -> dict:
    """The ``worker_started`` of a worker on ``host`` that is none of ``old``, once it is a
    member of a round (the host was taken back as fresh workers)."""
    fresh = run.wait_event(
        "worker_started",
        lambda e: e["host"] == host.address and e["worker"] not in old,
        timeout=60,
    )
    run.wait_event("round_formed", lambda e: fresh["worker"] in e["members"], timeout=60)
    return fresh


def shards_on(host) -> list[int]:
    """The ps shard processes running on ``host``."""
    return [p for p in host.pids() if "ps.server" in command_line(p)]


def members_on(run: ElasticRun, host) -> list[str]:
    """The members of the current round that were started on ``host``."""
    started = {e["worker"]: e["host"] for e in run.events("worker_started")}
    return [w for w in run.members() if started.get(w) == host.address]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("store", STORES)
def test_a_remote_worker_sigkilled_is_replaced_and_the_job_finishes_exact(
    three_hosts, tmp_path, store
):
    """A worker on another host SIGKILLed (by its own host's process id, as an OOM killer
    would): the driver hears of it over ssh, the round re-forms, the job is exact."""
    a, b, _ = three_hosts
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    hold_at(hold, 20)
    with job_store(store, three_hosts, tmp_path) as extra:
        args = [
            *("-H", f"{a.address}:2,{b.address}:2", "-np", "4", "--min-np", "2"),
            *("--launcher", "ssh", *extra),
        ]
        with ElasticRun([*args, *workload(out, hold)], tmp_path, env=three_hosts.env()) as run:
            run.wait_progress(20)
            victim = members_on(run, b)[0]
            pid = run.worker_pids()[victim]
            rounds = len(run.events("round_formed"))
            killed = b.run(["kill", "-KILL", str(pid)])
            assert killed.returncode == 0, killed.stderr
            failed = run.wait_event("worker_failed", lambda e: e["worker"] == victim, timeout=30)
            assert failed["host"] == b.address and failed["code"] == -9, failed
            after = run.wait_event("round_formed", after=rounds, timeout=30)
            assert victim not in after["members"]
            hold.unlink()
            assert run.wait(timeout=110) == 0, run.stderr_tail()
            assert not run.events("host_unreachable")  # a dead process is not a lost host
        nothing_left(a, b)
    check_exact_sum(out, SAMPLES, EPOCHS)


@pytest.mark.long  # 20 s; CI's discovery growth and shrink: tests/system/faults/test_chaos.py
@pytest.mark.timeout(180)
# etcd only: its agents outlive the driver's session (detached), the harder retirement;
# the embedded store's remote hosts are covered by the SIGKILL test above (20 s saved).
@pytest.mark.parametrize("store", ["etcd"])
def test_discovery_adds_then_removes_a_host_mid_run_and_the_job_finishes_exact(
    three_hosts, tmp_path, store
):
    """The discovery script lists a second host: workers start there over ssh and join a
    round of 4. Then it drops the first host: its workers are stopped, the round shrinks
    to the second host's 2, and the result is exact."""
    a, b, _ = three_hosts
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    script, hosts = hosts_file_discovery(tmp_path, f"{a.address}:2\n")
    hold_at(hold, 20)
    with job_store(store, three_hosts, tmp_path) as extra:
        args = [
            *("-np", "2", "--min-np", "2", "--host-discovery-script", str(script)),
            *("--discovery-interval", "0.2", "--launcher", "ssh", *extra),
        ]
        with ElasticRun([*args, *workload(out, hold)], tmp_path, env=three_hosts.env()) as run:
            run.wait_progress(20)
            write_hosts(hosts, f"{a.address}:2\n{b.address}:2\n")
            run.wait_event("host_added", lambda e: e["host"] == b.address, timeout=30)
            grown = run.wait_event("round_formed", lambda e: e["size"] == 4, timeout=60)
            assert len(members_on(run, b)) == 2, grown
            first = members_on(run, a)
            hold_at(hold, 40)
            run.wait_progress(40)

            write_hosts(hosts, f"{b.address}:2\n")
            run.wait_event("host_removed", lambda e: e["host"] == a.address, timeout=30)
            shrunk = run.wait_event("round_formed", lambda e: e["size"] == 2, after=1)
            assert not set(shrunk["members"]) & set(first)
            # Its workers were stopped, not left behind; then its agent is retired
            # while the job goes on (training is still held): the removed machine is
            # free of the job. (A later listing would start a fresh agent there.)
            wait_until(
                lambda: not [p for p in a.pids() if str(EXACT_SUM) in command_line(p)],
                30,
                "the removed host's workers to end",
            )
            wait_until(
                lambda: not [p for p in a.pids() if "driver.agent" in command_line(p)],
                30,
                "the removed host's agent to exit",
            )
            assert run.proc is not None and run.proc.poll() is None, run.stderr_tail()
            hold.unlink()
            assert run.wait(timeout=110) == 0, run.stderr_tail()
            stopped = {e["worker"] for e in run.events("worker_stopped")}
            assert set(first) <= stopped
            # An agent that left as asked is no lost host.
            assert not run.events("host_blacklisted") and not run.events("host_unreachable")
        nothing_left(a, b)
    results = check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
    assert [size for size, _ in results[0]["sizes"]] == [2, 4, 2]


@pytest.mark.timeout(180)
def test_a_sync_ps_shards_host_cut_the_shard_moves_and_its_stale_self_never_serves(
    three_hosts, tmp_path
):
    """--ps-mode sync, shard 0 on the first host, whose link goes down mid-run (no FIN,
    no RST: the shard and the host's worker keep running, unheard). The shard restarts on
    the other host from the newest complete checkpoint (a directory every host sees);
    the surviving worker pauses, never fails, and training converges at its exact step
    count. The link back, the stale shard and worker end without serving, and nothing is
    left on any host after the job."""
    a, b, _ = three_hosts
    out, ckpt, hold = tmp_path / "out", tmp_path / "ckpt", tmp_path / "hold"
    out.mkdir()
    steps = 300
    args = ["-H", f"{a.address}:1,{b.address}:1", "-np", "2", "--min-np", "1"]
    args += ["--launcher", "ssh", "--num-ps", "1", "--ps-placement", "spread"]
    args += ["--ps-mode", "sync", "--blacklist-cooldown-range", "2", "3"]
    args += ["--ps-checkpoint-dir", str(ckpt), "--ps-checkpoint-interval", "0.3"]
    args += ["-v"]  # the shards say where they serve
    command = ["python", str(PS_LINEAR), str(out), "--steps", str(steps), "--record-steps"]
    command += ["--pause-while", str(hold)]
    with ElasticRun([*args, *command], tmp_path, env=three_hosts.env()) as run:
        first = run.wait_event("ps_started", timeout=60)
        assert first["address"].startswith(f"{a.address}:")
        run.wait_event("checkpoint_written", timeout=60)
        hold.write_text("")  # the cut lands before training ends
        survivors = members_on(run, b)
        a.cut()
        hold.unlink()  # the survivor's next push goes to the shard that is cut off
        lost = run.wait_event("host_unreachable", lambda e: e["host"] == a.address, timeout=30)
        moved = run.wait_event("ps_started", after=1, timeout=60)
        assert moved["shard"] == 0 and moved["address"].startswith(f"{b.address}:")
        stale = a.pids()
        assert stale  # the cut host's processes live on, unheard

        hold.write_text("")  # the job runs on while the link comes back
        a.restore()
        wait_until(lambda: not set(stale) & set(a.pids()), 30, "the stale shard and worker to end")
        # After its cooldown the host gets a fresh worker through a fresh agent, which
        # runs what is assigned to it: that and nothing of the lost host's past.
        fresh_member(run, a, lost["workers"])
        assert not shards_on(a) and not set(lost["workers"]) & set(run.members())
        hold.unlink()
        assert run.wait(timeout=110) == 0, run.stderr_tail()
        failed = [e for e in run.events("worker_failed") if e["worker"] in survivors]
        assert not failed, failed  # a pause, not an error
        assert [e["shard"] for e in run.events("ps_started")] == [0, 0]
    nothing_left(a, b)
    serving = re.findall(r"shard 0 serving at (\S+)", run.err_path.read_text())
    assert serving == [first["address"], moved["address"]], serving  # no third copy
    results = check_converged(out, steps)
    assert {r["step"] for r in results} == {steps}, results
    assert not set(lost["workers"]) & {p.stem for p in out.glob("*.json")}


@pytest.mark.timeout(180)
def test_discovery_swapping_every_host_keeps_the_state_across_machines(three_hosts, tmp_path):
    """The discovery script swaps host a for host b (a node pool replaced whole): a's
    workers stay until b's hold the newest commit (a round of 4), then leave at a commit;
    nothing is rolled back and the result is exact."""
    a, b, _ = three_hosts
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    epochs = 4  # 20 ms a step: the job outlasts b's workers' start over ssh
    script, hosts = hosts_file_discovery(tmp_path, f"{a.address}:2\n")
    hold_at(hold, 20)
    args = [
        *("--min-np", "2", "--host-discovery-script", str(script)),
        *("--discovery-interval", "0.2", "--launcher", "ssh"),
        *exact_sum_command(out, SAMPLES, epochs, "--step-seconds", "0.02"),
        *("--pause-while", str(hold)),
    ]
    with ElasticRun(args, tmp_path, env=three_hosts.env()) as run:
        run.wait_progress(20)
        first = members_on(run, a)
        write_hosts(hosts, f"{b.address}:2\n")
        run.wait_event("host_removed", lambda e: e["host"] == a.address, timeout=30)
        hold.unlink()  # (a's workers must commit to hand over)
        both = run.wait_event("round_formed", lambda e: e["size"] == 4, timeout=90)
        assert set(first) <= set(both["members"])
        alone = run.wait_event("round_formed", lambda e: e["size"] == 2, after=1, timeout=60)
        assert not set(alone["members"]) & set(first)
        assert run.wait(timeout=120) == 0, run.stderr_tail()
        left = {e["worker"] for e in run.events("worker_stopped") if e["code"] == 0}
        assert set(first) <= left and not run.events("worker_failed")
        assert not [e for e in run.events("progress") if e.get("back_from")]
    nothing_left(a, b)
    results = check_exact_sum(out, SAMPLES, epochs, final_size=2)
    assert [size for size, _ in results[0]["sizes"]] == [2, 4, 2]
