"""Join mode under a real Slurm (Debian's slurmctld and slurmd, one slurmd per test host:
``tests/support/slurm.py``): an ``sbatch --no-kill`` script whose plain ``srun`` runs the
same ``elastic-run --join`` on every node, with the job id, the node names and the slots
(``--ntasks-per-node``) taken from Slurm's environment. etcd runs on a fourth host,
outside Slurm.

* The job trains across two nodes to an exact end, and the Slurm job COMPLETES.
* Three nodes, one cut mid-run (no FIN, no RST): the others go on (taking the lead when
  the cut node had it) and finish exact; Slurm marks the node down and srun, with
  ``--no-kill``, goes on.
* A second allocation joins the running job (the same ``--job-id``) and grows it; then
  it is scancelled, or preempted by a job of a higher partition: its node drains, the
  others go on without rolling back a step, its ``elastic-run`` exits 0, exact.
"""

from __future__ import annotations

import json
import secrets
import shlex
import sys
import time
from pathlib import Path

import pytest

from tests.support.etcd_cluster import EtcdCluster
from tests.support.hosts.netns import running_hosts
from tests.support.jobs import (
    WORKLOADS,
    check_exact_sum,
    exact_sum_command,
    formed_round_sizes,
    hold_at,
    wait_until,
)
from tests.support.paths import ROOT
from tests.support.slurm import URGENT, SlurmCluster

pytestmark = pytest.mark.system

SAMPLES, EPOCHS = 1200, 6
SECRET = secrets.token_hex(16)  # the job's: every node's, every allocation's
WORLD_GATE = WORKLOADS / "world_gate.py"


@pytest.fixture
def cluster(tmp_path):
    """Four test hosts: Slurm nodes on the first three, etcd on the fourth."""
    with running_hosts(4, tmp_path / "hosts") as hosts:
        etcd = EtcdCluster(1, tmp_path / "etcd", hosts=[hosts[3]]).start()
        try:
            with SlurmCluster(hosts, list(hosts)[:3], tmp_path / "slurm") as slurm:
                yield hosts, etcd, slurm
        finally:
            etcd.stop()


def batch_script(
    tmp_path: Path,
    etcd_url: str,
    worker: list[str],
    job_id: str = "",
    name: str = "train",
    flags: str = "",
) -> Path:
    """The sbatch script a user writes: a plain ``srun`` of ``elastic-run --join``
    (with ``flags`` more), each task's exit status kept (a scancel's SIGTERM must not end
    the shell before it)."""
    node = (
        f"{shlex.quote(sys.executable)} -m driver.cli --join --rendezvous {etcd_url} "
        f"{f'--job-id {job_id} ' if job_id else ''}-np 4 --min-np 2 {flags}"
        f"--events {tmp_path}/events-$SLURMD_NODENAME.jsonl {shlex.join(worker)}"
    )
    script = tmp_path / f"{name}.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"cd {ROOT}\n"
        f"export ELASTIC_JOB_SECRET={SECRET}\n"
        # each task expands its own node's name
        "srun --no-kill bash -c "
        + shlex.quote(
            f"trap true TERM; {node}; echo $? > {tmp_path}/exit-$SLURMD_NODENAME-$SLURM_LOCALID"
        )
        + "\n"
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


def round_sizes(tmp_path: Path) -> list[int]:
    """The sizes of the rounds formed so far, oldest first (whichever node led)."""
    return formed_round_sizes(tmp_path.glob("events-*.jsonl"))


def wait_for_round(tmp_path: Path, size: int, timeout: float = 60) -> None:
    """Until whichever node leads says a round of ``size`` formed."""
    wait_until(lambda: size in round_sizes(tmp_path), timeout, f"a round of {size}")


def last_round_size(tmp_path: Path) -> int:
    """The size of the newest round any node's events say formed (0 before any)."""
    sizes = round_sizes(tmp_path)
    return sizes[-1] if sizes else 0


def sbatch(slurm: SlurmCluster, script: Path, nodes: list[str], out: Path) -> str:
    """The script on ``nodes``, two tasks on each (two slots each, from Slurm)."""
    return slurm.sbatch(
        script,
        *("--no-kill", "-N", str(len(nodes)), "-w", ",".join(nodes)),
        *("--ntasks-per-node", "2", "--output", str(out)),
    )


@pytest.mark.timeout(150)
def test_srun_of_elastic_run_join_trains_one_job_across_the_nodes(tmp_path, cluster):
    hosts, etcd, slurm = cluster
    out = tmp_path / "out"
    out.mkdir()
    script = batch_script(tmp_path, etcd.url, exact_sum_command(out, SAMPLES, EPOCHS))
    job = sbatch(slurm, script, [hosts[0].name, hosts[1].name], tmp_path / "job.out")
    assert wait_for_end(slurm, job, 120) == "COMPLETED", (tmp_path / "job.out").read_text()
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=4)
    # One elastic-run per node joined with the node's 2 tasks as slots; the other task
    # of each node had nothing to do. All exited 0.
    exits = sorted(p.name for p in tmp_path.glob("exit-*"))
    assert exits == sorted(f"exit-{h.name}-{t}" for h in list(hosts)[:2] for t in (0, 1))
    assert {p.read_text().strip() for p in tmp_path.glob("exit-*")} == {"0"}


@pytest.mark.timeout(150)
@pytest.mark.long  # (18 s; restart mode over hosts is in CI by the host-cut test)
def test_a_world_of_restart_mode_spans_the_joined_nodes(tmp_path, cluster):
    """``--restart-workers`` in join mode under srun: one world over both nodes' slots,
    each worker told torchrun's variables (its host's index, rank 0's address on the
    first node), and the Slurm job completes once every worker exited 0."""
    hosts, etcd, slurm = cluster
    out = tmp_path / "out"
    out.mkdir()
    gate = [sys.executable, str(WORLD_GATE), str(out)]
    script = batch_script(tmp_path, etcd.url, gate, flags="--restart-workers ")
    job = sbatch(slurm, script, [hosts[0].name, hosts[1].name], tmp_path / "job.out")
    wait_until(lambda: len(list(out.glob("*.json"))) == 4, 90, "the world's 4 workers")
    told = [json.loads(p.read_text())["env"] for p in out.glob("*.json")]
    (out / "done").touch()
    assert wait_for_end(slurm, job, 60) == "COMPLETED", (tmp_path / "job.out").read_text()
    assert sorted(int(e["RANK"]) for e in told) == [0, 1, 2, 3]
    assert {(e["GROUP_RANK"], e["LOCAL_WORLD_SIZE"], e["WORLD_SIZE"]) for e in told} == {
        ("0", "2", "4"),
        ("1", "2", "4"),
    }
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in told}) == 1
    assert told[0]["MASTER_ADDR"] in {hosts[0].address, hosts[1].address}
    assert {p.read_text().strip() for p in tmp_path.glob("exit-*")} == {"0"}


@pytest.mark.timeout(180)
def test_a_cut_node_leaves_the_others_training_to_an_exact_end(tmp_path, cluster):
    hosts, etcd, slurm = cluster
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    hold_at(gate, 20)  # the cut lands mid-run
    worker = exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(gate))
    script = batch_script(tmp_path, etcd.url, worker)
    nodes = [h.name for h in list(hosts)[:3]]
    job = sbatch(slurm, script, nodes, tmp_path / "job.out")
    wait_for_round(tmp_path, 6)
    cut_at = time.monotonic()
    hosts[2].cut()  # the third node (the batch script runs on the first)
    gate.unlink()
    wait_for_round(tmp_path, 4, timeout=30)
    print(f"cut to the survivors' round: {time.monotonic() - cut_at:.2f}s")
    hosts[2].destroy()  # a cut host's processes run on, isolated: end them
    # The two nodes left end the job and exit 0. (Slurm itself would end the allocation
    # only once it takes the cut node for DOWN and its step for gone: 10 to 30 s more of
    # Slurm's own detection, not ours; the fixture ends it.)
    for node in nodes[:2]:
        ended = tmp_path / f"exit-{node}-0"
        code = wait_until(
            lambda ended=ended: ended.exists() and ended.read_text().strip(),  # (then written)
            90,
            f"{node}'s elastic-run to end; {slurm.log_tail()}",
        )
        assert code == "0", (tmp_path / "job.out").read_text()
    slurm.scancel(job)
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=4)


def two_allocations(tmp_path: Path, cluster, out: Path, gate: Path) -> tuple[str, str]:
    """A job of two nodes (the first allocation), then a second allocation of one node
    joining it: the Slurm job ids, once a round of all 6 workers formed. Training waits
    at commit 20 (``gate``) while the job grows; ``out`` takes the results."""
    hosts, etcd, slurm = cluster
    out.mkdir()
    hold_at(gate, 20)
    job_id = f"grow-{secrets.token_hex(4)}"  # both allocations join this job
    worker = exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(gate))
    allocations = []
    for name, nodes, size in (("first", hosts[:2], 4), ("second", hosts[2:3], 6)):
        script = batch_script(tmp_path, etcd.url, worker, job_id, name)
        nodes_named = [h.name for h in nodes]
        allocations.append(sbatch(slurm, script, nodes_named, tmp_path / f"{name}.out"))
        wait_for_round(tmp_path, size)
    return allocations[0], allocations[1]


@pytest.mark.timeout(180)
# A preemption is what users fear; an scancel ends the allocation the same way (its
# steps get SIGTERM, then SIGKILL) and runs with -m long (the suite's 15 minutes).
@pytest.mark.parametrize("ending", [pytest.param("scancel", marks=pytest.mark.long), "preempted"])
def test_a_second_allocation_joins_then_drains_with_nothing_rolled_back(tmp_path, cluster, ending):
    hosts, _, slurm = cluster
    out, gate = tmp_path / "out", tmp_path / "gate"
    asked = time.monotonic()
    first, second = two_allocations(tmp_path, cluster, out, gate)
    print(f"both allocations to their round of 6: {time.monotonic() - asked:.2f}s")
    if ending == "scancel":
        slurm.scancel(second)
    else:  # a job of a higher partition wants the node: Slurm preempts the second
        urgent = tmp_path / "urgent.sbatch"
        urgent.write_text("#!/bin/bash\ntrue\n")
        slurm.sbatch(urgent, "-p", URGENT, "-N", "1", "-w", hosts[2].name)
    # Slurm's SIGTERM reached the node and the handover round is out, while every worker
    # waits at the gate: they all take their next step on the old ring and change rounds
    # at the commit after it. (Running free, a worker that the round reaches only after
    # that commit redoes its next step's start: see docs/DESIGN.md, "Draining a host".)
    wait_until(lambda: last_round_size(tmp_path) == 4, 30, f"{hosts[2].name} to leave")
    gate.unlink()
    left = tmp_path / f"exit-{hosts[2].name}-0"
    wait_until(left.exists, 40, f"the drained node's elastic-run to end; {slurm.log_tail()}")
    assert left.read_text().strip() == "0", (tmp_path / "second.out").read_text()
    assert wait_for_end(slurm, second, 60) in ("CANCELLED", "COMPLETED", "PREEMPTED")
    assert wait_for_end(slurm, first, 120) == "COMPLETED", (tmp_path / "first.out").read_text()
    results = check_exact_sum(out, SAMPLES, EPOCHS, final_size=4)
    assert [r["rollbacks"] for r in results] == [0] * 4, results


@pytest.mark.timeout(180)
def test_the_first_allocation_scancelled_after_a_second_joined_hands_over_its_state(
    tmp_path, cluster
):
    """A job moves to a new allocation: the second joins, then the first (whose nodes
    hold the state, the driver's lead among them) is scancelled. Its workers stay until
    the second's hold the newest commit, then leave at a commit; the job finishes on the
    second allocation, exact."""
    _, _, slurm = cluster
    out, gate = tmp_path / "out", tmp_path / "gate"
    first, second = two_allocations(tmp_path, cluster, out, gate)
    slurm.scancel(first)
    gate.unlink()  # (the first's workers must commit, in a round with the second's)
    assert wait_for_end(slurm, first, 90) in ("CANCELLED", "COMPLETED")
    assert wait_for_end(slurm, second, 150) == "COMPLETED", (tmp_path / "second.out").read_text()
    assert last_round_size(tmp_path) == 2
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
