"""Whole jobs across separate test hosts (``tests/support/hosts/netns.py``): their own
addresses, host names, process ids and /dev/shm, reached over ssh, cut off the network
without a FIN or an RST. The driver runs here, on the hosts' bridge.

The workload is ``exact_sum`` (every sample of every epoch adds exact numbers to the
state), so "the job finished correct" is checked to the bit.
"""

from __future__ import annotations

import pytest

from tests.support.etcd_cluster import EtcdCluster
from tests.support.jobs import EXACT_SUM, ElasticRun, check_exact_sum, wait_until
from tests.system.faults.test_chaos import BATCH, EPOCHS, SAMPLES

pytestmark = pytest.mark.chaos


def workload(out_dir, pause_while=None) -> list[str]:
    """``exact_sum``; with ``pause_while``, training holds while that file exists (so a
    test can keep the job running across a host's cooldown without changing its result)."""
    return [
        "python",
        str(EXACT_SUM),
        str(out_dir),
        "--samples",
        str(SAMPLES),
        "--epochs",
        str(EPOCHS),
        "--batch",
        str(BATCH),
        *(["--pause-while", str(pause_while)] if pause_while else []),
    ]


def store_args(store: str, hosts, tmp_path) -> tuple[list[str], EtcdCluster | None]:
    """``--rendezvous`` for ``store``: the driver's embedded one (the default), or one
    etcd member on the last host (a machine of its own)."""
    if store == "embedded":
        return [], None
    cluster = EtcdCluster(1, tmp_path / "etcd", hosts=[hosts[-1]]).start()
    return ["--rendezvous", cluster.url], cluster


@pytest.mark.timeout(120)
def test_a_job_spans_hosts_with_the_default_store(three_hosts, tmp_path):
    """The embedded store is advertised at an address the hosts reach (not a host name,
    not loopback), and so are the workers' listeners."""
    a, b, _ = three_hosts
    out = tmp_path / "out"
    out.mkdir()
    args = ["-H", f"{a.address}:2,{b.address}:2", "-np", "4", "--launcher", "ssh"]
    with ElasticRun([*args, *workload(out)], tmp_path, env=three_hosts.env()) as run:
        assert run.wait(timeout=100) == 0, run.stderr_tail()
        started = run.events("job_started")[0]
    assert started["store"].startswith(f"embedded://{three_hosts.gateway}:")
    results = check_exact_sum(out, SAMPLES, EPOCHS)
    assert len(results) == 4


@pytest.mark.timeout(150)
@pytest.mark.parametrize("store", ["embedded", "etcd"])
def test_a_host_cut_mid_run_is_dropped_and_the_job_finishes_exact(three_hosts, tmp_path, store):
    """A host vanishes (link down: no FIN, no RST). Its peers report the silence, the
    driver finds the host does not answer, drops its workers at once, and the survivors
    go on; the result is exact."""
    a, b, _ = three_hosts
    out = tmp_path / "out"
    out.mkdir()
    extra, cluster = store_args(store, three_hosts, tmp_path)
    args = [
        *("-H", f"{a.address}:2,{b.address}:2", "-np", "4", "--min-np", "2"),
        *("--launcher", "ssh", *extra),
    ]
    try:
        with ElasticRun([*args, *workload(out)], tmp_path, env=three_hosts.env()) as run:
            run.wait_progress(30)
            b.cut()
            lost = run.wait_event("host_unreachable", timeout=30)
            assert lost["host"] == b.address and len(lost["workers"]) == 2
            after = run.wait_event("round_formed", lambda e: e["size"] == 2, timeout=30)
            assert not set(after["members"]) & set(lost["workers"])
            assert run.wait(timeout=110) == 0, run.stderr_tail()
    finally:
        if cluster is not None:
            cluster.stop()
    results = check_exact_sum(out, SAMPLES, EPOCHS)
    assert len(results) == 2  # the survivors (the cut host's workers never finished)


@pytest.mark.timeout(150)
def test_a_cut_host_that_returns_is_taken_back_as_fresh_workers(three_hosts, tmp_path):
    """The cut host's link returns: its stale workers end (they never rejoin with their
    old state), and after its cooldown the host gets fresh workers; exact result."""
    a, b, _ = three_hosts
    out = tmp_path / "out"
    out.mkdir()
    hold = tmp_path / "hold"
    args = [
        *("-H", f"{a.address}:2,{b.address}:2", "-np", "4", "--min-np", "2"),
        *("--launcher", "ssh", "--blacklist-cooldown-range", "2", "3"),
    ]
    with ElasticRun([*args, *workload(out, hold)], tmp_path, env=three_hosts.env()) as run:
        run.wait_progress(30)
        hold.touch()  # the job runs on, without training, until the host is back
        b.cut()
        lost = run.wait_event("host_unreachable", timeout=30)
        stale = b.pids()
        assert stale
        b.restore()
        # The stale workers end once the host is back in touch (the driver dropped their
        # ssh sessions; the store says they are out).
        wait_until(lambda: not set(stale) & set(b.pids()), 30, "the stale workers to end")
        fresh = run.wait_event(
            "worker_started",
            lambda e: e["host"] == b.address and e["worker"] not in lost["workers"],
            timeout=60,
        )
        rejoined = run.wait_event("round_formed", lambda e: fresh["worker"] in e["members"])
        assert not set(rejoined["members"]) & set(lost["workers"])
        hold.unlink()
        assert run.wait(timeout=110) == 0, run.stderr_tail()
    check_exact_sum(out, SAMPLES, EPOCHS)


@pytest.mark.long  # the store's own member failover runs in CI: test_store_outages
@pytest.mark.timeout(150)
def test_cutting_the_etcd_leaders_host_the_job_goes_on_with_the_other_members(
    three_hosts, tmp_path
):
    """etcd across machines: one member per host, workers on every host. The host of
    the etcd leader is cut: the store carries on with the other two members (clients
    move to them), the host's workers are dropped, and the job finishes exact."""
    out = tmp_path / "out"
    out.mkdir()
    cluster = EtcdCluster(3, tmp_path / "etcd", hosts=list(three_hosts)).start()
    try:
        hosts = ",".join(f"{h.address}:1" for h in three_hosts)
        args = ["-H", hosts, "-np", "3", "--min-np", "2", "--launcher", "ssh"]
        args += ["--rendezvous", cluster.url]
        with ElasticRun([*args, *workload(out)], tmp_path, env=three_hosts.env()) as run:
            run.wait_progress(30)
            leader = cluster.leader()
            assert leader is not None
            three_hosts[leader].cut()
            lost = run.wait_event("host_unreachable", timeout=45)
            assert lost["host"] == three_hosts[leader].address
            run.wait_event("round_formed", lambda e: e["size"] == 2, timeout=45)
            assert run.wait(timeout=110) == 0, run.stderr_tail()
    finally:
        cluster.stop()
    assert len(check_exact_sum(out, SAMPLES, EPOCHS)) == 2
