"""``elastic-run --ray ADDRESS`` on a real Ray cluster (``tests/support/ray_cluster.py``:
``ray start --head`` in one test host, ``ray start --address`` in the others): the
hosts are the cluster's alive nodes, each host's agent runs on its node through an actor
pinned there. A node added mid-run grows the job at the next discovery; a node whose
link is cut (no FIN, no RST) is a lost host; the job ends exact."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.hosts.netns import running_hosts
from tests.support.jobs import (
    check_exact_sum,
    exact_sum_command,
    formed_round_sizes,
    hold_at,
    wait_until,
)
from tests.support.paths import ROOT
from tests.support.ray_cluster import RayCluster

pytestmark = pytest.mark.system

SAMPLES, EPOCHS = 1200, 4


@pytest.fixture
def cluster(tmp_path):
    """Three test hosts; a Ray head on the first and a node on the second."""
    with (
        running_hosts(3, tmp_path / "hosts") as hosts,
        RayCluster(hosts[0], tmp_path / "ray") as ray,
    ):
        ray.add(hosts[1])
        ray.wait_alive(2)
        yield hosts, ray


def rounds(events) -> list[int]:
    return formed_round_sizes([events])


@pytest.mark.timeout(240)
def test_a_ray_clusters_nodes_train_grow_and_lose_one_to_an_exact_end(tmp_path, cluster):
    hosts, ray = cluster
    out, gate, events = tmp_path / "out", tmp_path / "gate", tmp_path / "events.jsonl"
    out.mkdir()
    hold_at(gate, 20)
    worker = exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(gate))
    log = open(tmp_path / "driver.out", "w")  # noqa: SIM115 (closed below)
    driver = hosts[0].popen(  # on a node of the cluster, as a Ray driver must be
        [
            *(sys.executable, "-m", "driver.cli", "--ray", ray.address),
            *("--slots-per-host", "1", "-np", "2", "--min-np", "1"),
            *("--events", str(events), *worker),
        ],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        tail = lambda: (tmp_path / "driver.out").read_text(errors="replace")[-2000:]  # noqa: E731
        wait_until(lambda: 2 in rounds(events), 90, "a round on both nodes")
        ray.add(hosts[2])  # the cluster grows: so does the job
        wait_until(lambda: 3 in rounds(events), 90, f"a round of 3; {tail()}")
        hosts[1].cut()
        gate.unlink()
        wait_until(lambda: rounds(events)[-1:] == [2], 60, f"the survivors' round; {tail()}")
        hosts[1].destroy()  # a cut host's processes run on, isolated: end them
        assert driver.wait(timeout=120) == 0, tail()
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=10)
        log.close()
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
