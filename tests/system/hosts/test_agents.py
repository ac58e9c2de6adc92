"""The per-host agents with real processes on this machine (etcd store: every host's
processes run under its agent, which outlives the driver).

* per-host control: each host's workers are registered under their agent's lease
  (they register through it, ``rendezvous.host_channel``), no lease of their own;
* an agent SIGKILLed: its host is lost at once (its lease lapses), its workers are
  dropped and the job finishes exact on the others; after the host's cooldown a fresh
  agent serves it, fresh workers register through the fresh agent, and the job
  finishes exact on every host;
* a host discovery removes: its agent is retired once its workers are stopped (it
  exits, and that is no lost host); listed again, the host gets a fresh agent that the
  old retirement does not stop;
* the driver SIGKILLed: training goes on without it (the committed step keeps
  advancing), then with no driver returning the agents stop their workers after
  ``--driver-timeout`` and exit: nothing of the job is left running.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from rendezvous.keys import JobKeys
from rendezvous.schema.workers import WorkerInfo
from tests.support.jobs import (
    ElasticRun,
    agents,
    check_exact_sum,
    committed,
    exact_sum_command,
    hold_at,
    hosts_file_discovery,
    pid_alive,
    read_store,
    wait_until,
    write_hosts,
)

pytestmark = pytest.mark.system

SAMPLES, BATCH = 1200, 4


def held_job(tmp_path, url: str, *host_args: str, hold: int) -> tuple[Path, Path, str, list]:
    """An exact-sum job of 12 epochs on this machine (``host_args``: its hosts) with the
    etcd store at ``url``, held at ``hold`` commits by its gate: its output directory,
    the gate, the job id and the ``elastic-run`` arguments."""
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    job_id = f"t{uuid.uuid4().hex[:10]}"
    hold_at(gate, hold)  # however fast the job, the change lands mid-run
    command = exact_sum_command(out, SAMPLES, 12, "--pause-while", str(gate))
    args = [*host_args, "--launcher", "local", "--rendezvous", url, "--job-id", job_id]
    return out, gate, job_id, [*args, *command]


def registrations_by_host(url: str, job_id: str) -> dict[str, list[str]]:
    """The job's registered workers by host, each checked to be under the lease of its
    host's agent (per-host control: the store holds one lease per host, none a worker's)."""
    keys = JobKeys(job_id)
    workers, agent_kvs = read_store(
        url, lambda store: (store.get_prefix(keys.workers)[0], store.get_prefix(keys.agents)[0])
    )
    agent_lease = {kv.key[len(keys.agents) :]: kv.lease for kv in agent_kvs}
    by_host: dict[str, list[str]] = {}
    for kv in workers:
        info = WorkerInfo.from_json(kv.value)
        assert kv.lease and kv.lease == agent_lease.get(info.host), (info, agent_lease)
        by_host.setdefault(info.host, []).append(info.worker_id)
    return by_host


@pytest.mark.timeout(90)
def test_an_agent_sigkilled_its_hosts_workers_are_dropped_and_the_job_finishes_exact(
    tmp_path, etcd_server
):
    hosts = ("-H", "a:2,b:2", "-np", "4", "--min-np", "2")
    out, gate, job_id, argv = held_job(tmp_path, etcd_server.url, *hosts, hold=40)
    with ElasticRun(argv, tmp_path) as run:
        run.wait_progress(40)
        registered = registrations_by_host(etcd_server.url, job_id)
        assert sorted(len(ws) for ws in registered.values()) == [2, 2], registered
        victims = [w for w, pid in run.worker_pids().items() if w.startswith("a-")]
        victim_pids = [run.worker_pids()[w] for w in victims]
        os.kill(agents(etcd_server.url, job_id)["a"].pid, signal.SIGKILL)
        lost = run.wait_event("host_unreachable", timeout=20)
        assert lost["host"] == "a" and sorted(lost["workers"]) == sorted(victims)
        assert "agent" in lost["detail"]
        after = run.wait_event("round_formed", lambda e: e["size"] == 2, timeout=20)
        assert not set(after["members"]) & set(victims)
        # The dead agent's workers end too (orphaned: their parent was the agent).
        wait_until(lambda: not any(pid_alive(p) for p in victim_pids), 15, "a's workers to end")
        gate.unlink()
        assert run.wait(timeout=60) == 0, run.stderr_tail()
    check_exact_sum(out, SAMPLES, 12, final_size=2)


@pytest.mark.timeout(120)
def test_a_hosts_agent_sigkilled_then_restarted_fresh_workers_register_through_it(
    tmp_path, etcd_server
):
    hosts = ("-H", "a:2,b:2", "-np", "4", "--min-np", "2")
    cooldown = ("--blacklist-cooldown-range", "1", "2")
    out, gate, job_id, argv = held_job(tmp_path, etcd_server.url, *hosts, *cooldown, hold=30)
    with ElasticRun(argv, tmp_path) as run:
        run.wait_progress(30)
        old = agents(etcd_server.url, job_id)["a"]
        old_workers = registrations_by_host(etcd_server.url, job_id)["a"]
        os.kill(old.pid, signal.SIGKILL)
        run.wait_event("host_unreachable", lambda e: e["host"] == "a", timeout=20)
        # After its cooldown the host gets a fresh agent, and fresh workers that register
        # through it (the old ones ended with their agent: nobody registers them now).
        back = run.wait_event(
            "round_formed",
            lambda e: e["size"] == 4 and not set(e["members"]) & set(old_workers),
            timeout=60,
        )
        fresh = agents(etcd_server.url, job_id)["a"]
        assert fresh.agent_id != old.agent_id and pid_alive(fresh.pid)
        registered = registrations_by_host(etcd_server.url, job_id)
        assert len(registered["a"]) == 2 and set(registered["a"]) <= set(back["members"])
        gate.unlink()
        assert run.wait(timeout=60) == 0, run.stderr_tail()
    check_exact_sum(out, SAMPLES, 12, final_size=4)


@pytest.mark.timeout(120)
@pytest.mark.long  # (19 s; the retirement is in CI by the multihost discovery test)
def test_a_removed_hosts_agent_retires_and_a_fresh_one_serves_it_when_listed_again(
    tmp_path, etcd_server
):
    script, hosts = hosts_file_discovery(tmp_path, "a:2\nb:2\n")
    listed = ["-np", "4", "--min-np", "2", "--host-discovery-script", str(script)]
    listed += ["--discovery-interval", "0.2"]
    out, gate, job_id, argv = held_job(tmp_path, etcd_server.url, *listed, hold=20)
    with ElasticRun(argv, tmp_path) as run:
        run.wait_progress(20)
        old = agents(etcd_server.url, job_id)["b"]
        write_hosts(hosts, "a:2\n")
        run.wait_event("round_formed", lambda e: e["size"] == 2, timeout=30)
        wait_until(lambda: not pid_alive(old.pid), 20, "the removed host's agent to exit")
        assert "b" not in agents(etcd_server.url, job_id)
        assert run.proc is not None and run.proc.poll() is None, run.stderr_tail()
        hold_at(gate, 40)
        write_hosts(hosts, "a:2\nb:2\n")
        run.wait_event("round_formed", lambda e: e["size"] == 4, after=2, timeout=60)
        fresh = agents(etcd_server.url, job_id)["b"]
        assert fresh.agent_id != old.agent_id and pid_alive(fresh.pid)
        run.wait_progress(40)
        assert pid_alive(fresh.pid)  # the old retirement names the old agent only
        gate.unlink()
        assert run.wait(timeout=60) == 0, run.stderr_tail()
        assert not run.events("host_blacklisted") and not run.events("host_unreachable")
    check_exact_sum(out, SAMPLES, 12)


@pytest.mark.timeout(90)
def test_the_driver_sigkilled_training_goes_on_then_agents_stop_after_driver_timeout(
    tmp_path, etcd_server
):
    out = tmp_path / "out"
    out.mkdir()
    job_id = f"t{uuid.uuid4().hex[:10]}"
    args = [
        *("-H", "a:1,b:1", "-np", "2", "--launcher", "local", "--progress-interval", "0.5"),
        *("--rendezvous", etcd_server.url, "--job-id", job_id, "--driver-timeout", "4"),
    ]
    with ElasticRun([*args, *exact_sum_command(out, SAMPLES, 400)], tmp_path) as run:
        run.wait_progress(40)
        workers = list(run.worker_pids().values())
        agent_pids = [r.pid for r in agents(etcd_server.url, job_id).values()]
        assert len(agent_pids) == 2 and len(workers) == 2
        run.proc.send_signal(signal.SIGKILL)  # no chance to stop anything itself
        run.wait(timeout=10)
        # No driver: the committed step keeps advancing.
        at_kill = wait_until(lambda: committed(etcd_server.url, job_id), 10, "a progress record")
        wait_until(
            lambda: committed(etcd_server.url, job_id) >= at_kill + 100,
            20,
            "training to go on without the driver",
        )
        assert all(pid_alive(p) for p in workers + agent_pids)
        # No driver returns: after its lease lapses and --driver-timeout, everything ends.
        wait_until(
            lambda: not any(pid_alive(p) for p in workers + agent_pids),
            40,
            "the agents to stop their workers and exit",
        )
        assert not agents(etcd_server.url, job_id)


@pytest.mark.long  # the driver timeout's stop runs in CI with the driver alone gone
@pytest.mark.timeout(90)
def test_with_the_driver_and_its_store_both_gone_agents_stop_after_driver_timeout(
    tmp_path, etcd_single
):
    """etcd itself dies with the driver: an agent that cannot see the store sees no
    leader either, so the --driver-timeout clock starts then, and nothing is left."""
    out = tmp_path / "out"
    out.mkdir()
    job_id = f"t{uuid.uuid4().hex[:10]}"
    args = [
        *("-H", "a:1,b:1", "-np", "2", "--launcher", "local"),
        *("--rendezvous", etcd_single.url, "--job-id", job_id, "--driver-timeout", "3"),
    ]
    with ElasticRun([*args, *exact_sum_command(out, SAMPLES, 400)], tmp_path) as run:
        run.wait_progress(40)
        workers = list(run.worker_pids().values())
        agent_pids = [r.pid for r in agents(etcd_single.url, job_id).values()]
        run.proc.send_signal(signal.SIGKILL)
        etcd_single.kill(0)
        run.wait(timeout=10)
        wait_until(
            lambda: not any(pid_alive(p) for p in workers + agent_pids),
            30,
            "the agents to stop their workers and exit without a store",
        )


def agent_pids(host) -> list[int]:
    """The agents running on a test host (ids as seen from here)."""
    found = []
    for pid in host.pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"driver.agent" in argv:
            found.append(pid)
    return found


@pytest.mark.timeout(120)
def test_on_separate_hosts_an_agent_sigkilled_makes_its_host_lost(three_hosts, tmp_path):
    """Agents over ssh (embedded store): the agent of one host SIGKILLed, the host's
    workers are dropped at once, they end with it (orphaned), the job finishes exact."""
    a, b, _ = three_hosts
    out = tmp_path / "out"
    out.mkdir()
    args = ["-H", f"{a.address}:2,{b.address}:2", "-np", "4", "--min-np", "2"]
    args += ["--launcher", "ssh"]
    gate = tmp_path / "gate"
    hold_at(gate, 40)  # however fast the job, the agent dies mid-run
    command = exact_sum_command(out, SAMPLES, 12, "--pause-while", str(gate))
    with ElasticRun([*args, *command], tmp_path, env=three_hosts.env()) as run:
        run.wait_progress(40)
        (victim,) = agent_pids(b)
        os.kill(victim, signal.SIGKILL)
        lost = run.wait_event("host_unreachable", timeout=20)
        assert lost["host"] == b.address and len(lost["workers"]) == 2
        after = run.wait_event("round_formed", lambda e: e["size"] == 2, timeout=20)
        assert not set(after["members"]) & set(lost["workers"])
        wait_until(lambda: not b.pids(), 20, "the lost host's workers to end")
        gate.unlink()
        assert run.wait(timeout=80) == 0, run.stderr_tail()
    check_exact_sum(out, SAMPLES, 12, final_size=2)


@pytest.mark.timeout(150)
def test_on_separate_hosts_workers_outlive_a_sigkilled_driver_then_stop(three_hosts, tmp_path):
    """etcd on its own host; agents over ssh leave their ssh session. The driver
    SIGKILLed: the committed step keeps advancing; no driver returns: after
    --driver-timeout nothing of the job runs on any host."""
    from tests.support.etcd_cluster import EtcdCluster

    a, b, c = three_hosts
    out = tmp_path / "out"
    out.mkdir()
    job_id = f"t{uuid.uuid4().hex[:10]}"
    cluster = EtcdCluster(1, tmp_path / "etcd", hosts=[c]).start()
    try:
        args = ["-H", f"{a.address}:1,{b.address}:1", "-np", "2", "--launcher", "ssh"]
        args += ["--rendezvous", cluster.url, "--job-id", job_id, "--driver-timeout", "4"]
        args += ["--progress-interval", "0.5"]
        command = exact_sum_command(out, SAMPLES, 400)
        with ElasticRun([*args, *command], tmp_path, env=three_hosts.env()) as run:
            run.wait_progress(40)
            assert agent_pids(a) and agent_pids(b)
            run.proc.send_signal(signal.SIGKILL)
            run.wait(timeout=10)
            at_kill = wait_until(lambda: committed(cluster.url, job_id), 10, "a progress record")
            wait_until(
                lambda: committed(cluster.url, job_id) >= at_kill + 100,
                20,
                "training to go on without the driver",
            )
            assert agent_pids(a) and agent_pids(b)
            wait_until(
                lambda: not a.pids() and not b.pids(),
                40,
                "every process of the job to end on its host",
            )
            assert not agents(cluster.url, job_id)
    finally:
        cluster.stop()


@pytest.mark.timeout(150)
def test_a_spread_ps_shard_whose_host_is_lost_restarts_on_another_host(three_hosts, tmp_path):
    """--ps-placement spread: shard 0 runs on the first host. That host's agent
    SIGKILLed: the shard restarts on the other host from the newest checkpoint (a
    directory every host sees), the surviving worker goes on, and training converges."""
    from tests.system.ps.test_jobs import PS_LINEAR, check_converged

    a, b, _ = three_hosts
    out, ckpt, hold = tmp_path / "out", tmp_path / "ckpt", tmp_path / "hold"
    out.mkdir()
    args = ["-H", f"{a.address}:1,{b.address}:1", "-np", "2", "--min-np", "1"]
    args += ["--launcher", "ssh", "--num-ps", "1", "--ps-placement", "spread"]
    args += ["--ps-checkpoint-dir", str(ckpt), "--ps-checkpoint-interval", "0.3"]
    command = ["python", str(PS_LINEAR), str(out), "--steps", "300", "--pause-while", str(hold)]
    with ElasticRun([*args, *command], tmp_path, env=three_hosts.env()) as run:
        first = run.wait_event("ps_started", timeout=60)
        assert first["address"].startswith(f"{a.address}:")
        run.wait_event("checkpoint_written", timeout=60)
        hold.write_text("")  # the kill lands before training ends
        (victim,) = agent_pids(a)
        os.kill(victim, signal.SIGKILL)
        run.wait_event("host_unreachable", lambda e: e["host"] == a.address, timeout=20)
        moved = run.wait_event("ps_started", after=1, timeout=60)
        assert moved["shard"] == 0 and moved["address"].startswith(f"{b.address}:")
        hold.unlink()
        assert run.wait(timeout=100) == 0, run.stderr_tail()
    check_converged(out, 300)


@pytest.mark.timeout(120)
def test_on_separate_hosts_the_embedded_stores_driver_sigkilled_ends_everything(
    three_hosts, tmp_path
):
    """With the embedded store the driver is the store: SIGKILL it and the job ends on
    every host (the agents' ssh sessions end, each agent stops its workers)."""
    a, b, _ = three_hosts
    out = tmp_path / "out"
    out.mkdir()
    args = ["-H", f"{a.address}:1,{b.address}:1", "-np", "2", "--launcher", "ssh"]
    command = exact_sum_command(out, SAMPLES, 400)
    with ElasticRun([*args, *command], tmp_path, env=three_hosts.env()) as run:
        run.wait_progress(40)
        assert agent_pids(a) and agent_pids(b)
        run.proc.send_signal(signal.SIGKILL)
        run.wait(timeout=10)
        wait_until(lambda: not a.pids() and not b.pids(), 30, "every process on the hosts to end")
