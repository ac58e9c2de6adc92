"""Join mode under a real Slurm (Debian's slurmctld and slurmd, one slurmd per test host:
``tests/support/slurm.py``): an ``sbatch --no-kill`` script whose ``srun`` runs the same
``elastic-run --join`` on every node, with the job id and the node names taken from
Slurm's environment. etcd runs on a third host, outside the allocation.

* The job trains across both nodes to an exact end, and the Slurm job COMPLETES.
* A node's link is cut mid-run (no FIN, no RST): the other node goes on (taking the
  lead when the cut node had it) and finishes exact; Slurm marks the node down and
  srun, with ``--no-kill``, goes on.
"""

from __future__ import annotations

import secrets
import shlex
import sys
import time
from pathlib import Path

import pytest

from tests.support.etcd_cluster import EtcdCluster
from tests.support.hosts.netns import running_hosts
from tests.support.jobs import check_exact_sum, exact_sum_command, hold_at, wait_until
from tests.support.paths import ROOT
from tests.support.slurm import SlurmCluster

pytestmark = pytest.mark.system

SAMPLES, EPOCHS = 1200, 6


@pytest.fixture
def cluster(tmp_path):
    """Three test hosts: Slurm nodes on the first two, etcd on the third."""
    with running_hosts(3, tmp_path / "hosts") as hosts:
        etcd = EtcdCluster(1, tmp_path / "etcd", hosts=[hosts[2]]).start()
        try:
            with SlurmCluster(hosts, [hosts[0], hosts[1]], tmp_path / "slurm") as slurm:
                yield hosts, etcd, slurm
        finally:
            etcd.stop()


def batch_script(tmp_path: Path, etcd_url: str, worker: list[str]) -> Path:
    """The sbatch script a user writes: one ``elastic-run --join`` per node."""
    node = (
        f"{shlex.quote(sys.executable)} -m driver.cli --join --rendezvous {etcd_url} "
        "--slots-per-host 2 -np 4 --min-np 2 "
        f"--events {tmp_path}/events-$SLURMD_NODENAME.jsonl {shlex.join(worker)}"
    )
    script = tmp_path / "train.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"cd {ROOT}\n"
        f"export ELASTIC_JOB_SECRET={secrets.token_hex(16)}  # the job's, every node's\n"
        # each task expands its own node's name
        f"srun --no-kill --ntasks-per-node 1 bash -c {shlex.quote(node)}\n"
    )
    return script


def wait_for_end(slurm: SlurmCluster, job: str, timeout: float) -> str:
    return wait_until(
        lambda: (
            (state := slurm.job_state(job)) not in ("PENDING", "RUNNING", "COMPLETING") and state
        ),
        timeout,
        f"Slurm job {job} to end; {slurm.log_tail()}",
    )


@pytest.mark.timeout(150)
def test_srun_of_elastic_run_join_trains_one_job_across_the_nodes(tmp_path, cluster):
    _, etcd, slurm = cluster
    out = tmp_path / "out"
    out.mkdir()
    script = batch_script(tmp_path, etcd.url, exact_sum_command(out, SAMPLES, EPOCHS))
    job = slurm.sbatch(script, "--no-kill", "-N", "2", "--output", str(tmp_path / "job.out"))
    assert wait_for_end(slurm, job, 120) == "COMPLETED", (tmp_path / "job.out").read_text()
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=4)


@pytest.mark.timeout(180)
def test_a_cut_node_leaves_the_other_training_to_an_exact_end(tmp_path, cluster):
    hosts, etcd, slurm = cluster
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    hold_at(gate, 20)  # the cut lands mid-run
    worker = exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(gate))
    script = batch_script(tmp_path, etcd.url, worker)
    job = slurm.sbatch(script, "--no-kill", "-N", "2", "--output", str(tmp_path / "job.out"))
    wait_until(  # in the events of whichever node leads
        lambda: any('"size": 4' in p.read_text() for p in tmp_path.glob("events-*.jsonl")),
        60,
        "a round of 4",
    )
    cut_at = time.monotonic()
    hosts[1].cut()  # the second node (the batch script runs on the first)
    gate.unlink()
    survivor = tmp_path / f"events-{hosts[0].name}.jsonl"  # it leads now, whoever did
    wait_until(
        lambda: any(
            '"round_formed"' in line and '"size": 2' in line
            for line in survivor.read_text().splitlines()
        ),
        30,
        "a round of the survivors",
    )
    print(f"cut to the survivors' round: {time.monotonic() - cut_at:.2f}s")
    hosts[1].destroy()  # a cut host's processes run on, isolated: end them
    assert wait_for_end(slurm, job, 120) == "COMPLETED", (tmp_path / "job.out").read_text()
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
