"""``elastic-run --launcher slurm`` from an ``sbatch`` script, on a real Slurm
(``tests/support/slurm.py``): the allocation's nodes are the hosts (their slots from
``--ntasks-per-node``), each host's agent is a one-task step started with ``srun``
(no ssh), and a node an administrator drains (``scontrol update ... State=DRAIN``)
leaves the job: its workers go at their next commit, nothing rolled back, exact. In
restart mode (``--restart-workers``) one world of a torchrun script spans the nodes,
and a node cut off the network restarts it on the node left."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from tests.support.hosts.netns import running_hosts
from tests.support.jobs import check_exact_sum, exact_sum_command, hold_at, wait_until
from tests.support.paths import ROOT
from tests.support.slurm import SlurmCluster
from tests.system.jobs.test_restart_workers import EXAMPLE

pytestmark = pytest.mark.system

SAMPLES, EPOCHS = 1200, 6
DDP_EPOCHS = 8  # the torchrun script's


@pytest.fixture
def cluster(tmp_path):
    """Two test hosts, each a Slurm node."""
    with (
        running_hosts(2, tmp_path / "hosts") as hosts,
        SlurmCluster(hosts, list(hosts), tmp_path / "slurm") as slurm,
    ):
        yield hosts, slurm


@pytest.mark.timeout(150)
def test_the_allocations_nodes_train_and_a_drained_node_leaves_with_nothing_rolled_back(
    tmp_path, cluster
):
    hosts, slurm = cluster
    out, gate, events = tmp_path / "out", tmp_path / "gate", tmp_path / "events.jsonl"
    out.mkdir()
    hold_at(gate, 20)
    worker = exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(gate))
    driver = (
        f"{shlex.quote(sys.executable)} -m driver.cli --launcher slurm -np 4 --min-np 2 "
        f"--events {events} {shlex.join(worker)}"
    )
    script = tmp_path / "train.sbatch"
    script.write_text(f"#!/bin/bash\ncd {ROOT}\n{driver}\n")
    job = slurm.sbatch(
        script,
        *("--no-kill", "-N", "2", "--ntasks-per-node", "2"),
        *("--output", str(tmp_path / "job.out")),
    )
    wait_until(
        lambda: events.exists() and '"size": 4,' in events.read_text(),
        60,
        f"a round of 4; {slurm.log_tail()}",
    )
    drained = hosts[1].name
    subprocess.run(
        ["scontrol", "update", f"NodeName={drained}", "State=DRAIN", "Reason=test"],
        check=True,
        env=slurm.env(),
        timeout=10,
    )
    wait_until(  # the handover round is out while every worker waits at the gate
        lambda: '"size": 2,' in events.read_text(), 30, f"{drained} to leave"
    )
    gate.unlink()
    state = wait_until(
        lambda: (s := slurm.job_state(job)) not in ("RUNNING", "COMPLETING") and s,
        90,
        "the Slurm job to end",
    )
    assert state == "COMPLETED", (tmp_path / "job.out").read_text()
    results = check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
    assert [r["rollbacks"] for r in results] == [0, 0], results


@pytest.mark.long  # restart mode's host cut runs in CI on ssh hosts (test_restart_hostcut)
@pytest.mark.timeout(150)
def test_restart_mode_runs_a_world_over_the_allocation_and_a_cut_node_restarts_it(
    tmp_path, cluster
):
    """``--restart-workers`` with ``--launcher slurm``: one world of a torchrun script
    across both nodes (their agents started by srun); the second node cut off the
    network (no FIN, no RST: its agent's lease lapses) stops that world, the next runs
    on the node left, and the script's own checkpoint carries the training to its end:
    every epoch once, none lost."""
    import torch

    hosts, slurm = cluster
    hosts.quick_resolver()  # torch's store looks its peers' names up
    ckpt, events, ended = tmp_path / "ckpt", tmp_path / "events.jsonl", tmp_path / "exit"
    command = ["python", str(EXAMPLE), str(ckpt), "--epochs", str(DDP_EPOCHS), "--batch-size", "8"]
    driver = (
        f"{shlex.quote(sys.executable)} -m driver.cli --launcher slurm --restart-workers "
        f"-np 2 --min-np 1 --events {events} {shlex.join(command)}"
    )
    script = tmp_path / "train.sbatch"
    script.write_text(f"#!/bin/bash\ncd {ROOT}\n{driver}\necho $? > {ended}\n")
    out = tmp_path / "job.out"
    job = slurm.sbatch(
        script, *("--no-kill", "-N", "2", "--ntasks-per-node", "1"), "--output", str(out)
    )
    wait_until(
        lambda: out.exists() and "epoch 1:" in out.read_text(),
        90,
        f"two epochs of world 1; {slurm.log_tail()}",
    )
    hosts[1].cut()  # not the batch script's node (the first): Slurm would strand the job
    code = wait_until(
        lambda: ended.exists() and ended.read_text().strip(),
        90,
        f"the driver to end; {slurm.log_tail()}",
    )
    hosts[1].destroy()
    slurm.scancel(job)
    assert code == "0", out.read_text()
    worlds = [
        (w["size"], w["hosts"])
        for w in map(json.loads, events.read_text().splitlines())
        if w["kind"] == "world_started"
    ]
    first, second = (h.name for h in hosts)
    assert worlds[0] == (2, [first, second]) and worlds[-1] == (1, [first]), worlds
    state = torch.load(ckpt / "checkpoint.pt", map_location="cpu")
    assert [h["epoch"] for h in state["history"]] == list(range(DDP_EPOCHS))
    sizes = [h["world_size"] for h in state["history"]]
    assert sizes[:2] == [2, 2] and sizes[-1] == 1 and sizes == sorted(sizes, reverse=True)
