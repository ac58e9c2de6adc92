"""``elastic-run --launcher slurm`` from an ``sbatch`` script, on a real Slurm
(``tests/support/slurm.py``): the allocation's nodes are the hosts (their slots from
``--ntasks-per-node``), each host's agent is a one-task step started with ``srun``
(no ssh), and a node an administrator drains (``scontrol update ... State=DRAIN``)
leaves the job: its workers go at their next commit, nothing rolled back, exact."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from tests.support.hosts.netns import running_hosts
from tests.support.jobs import check_exact_sum, exact_sum_command, hold_at, wait_until
from tests.support.paths import ROOT
from tests.support.slurm import SlurmCluster

pytestmark = pytest.mark.system

SAMPLES, EPOCHS = 1200, 6


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
