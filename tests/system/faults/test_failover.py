"""Driver failover on a real etcd: a standby takes a running job over, and a driver that
lost the lead changes nothing.

Both drivers of a job get the same ``ELASTIC_JOB_SECRET``: the standby launches
replacements that must handshake with the workers the first driver started.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
import uuid

import pytest

from driver.leadership.claim import BEAT_INTERVAL
from driver.leadership.standby import BEAT_SILENCE
from rendezvous import open_store
from rendezvous.checkpoint_claim import RECORD
from rendezvous.keys import JobKeys
from rendezvous.schema.leader import DriverRecord
from rendezvous.schema.rounds import Plan
from tests.support.etcd_cluster import EtcdCluster
from tests.support.jobs import (
    ElasticRun,
    check_exact_sum,
    committed,
    exact_sum_command,
    hold_at,
    hosts_file_discovery,
    wait_until,
    write_hosts,
)

SAMPLES, EPOCHS = 400, 20


def _args(etcd_server, job_id: str, out, *extra: str) -> list[str]:
    return [
        "-np",
        "2",
        "--progress-interval",
        "0.5",
        "--rendezvous",
        etcd_server.url,
        "--job-id",
        job_id,
        *extra,
        *exact_sum_command(out, SAMPLES, EPOCHS, "--pause-while", str(out / "pause")),
    ]


def _read(etcd_server, key: str) -> bytes | None:
    with open_store(etcd_server.url) as store:
        kv = store.get(key)
        return kv.value if kv is not None else None


def _owner_pid(ckpt) -> int | None:
    """The pid of the driver the checkpoint folder's owner record names (None: none)."""
    record = ckpt / RECORD
    return json.loads(record.read_text())["pid"] if record.exists() else None


def _kill_rank(etcd_server, keys: JobKeys, run: ElasticRun, rank: int) -> str:
    """SIGKILL the worker of ``rank`` in the store's current plan (``run`` knows its
    pid: it started or adopted it); its worker id."""
    plan = Plan.from_json(_read(etcd_server, keys.round) or b"")
    victim = plan.members[rank].worker_id
    os.kill(run.worker_pids()[victim], signal.SIGKILL)
    return victim


@pytest.mark.timeout(150)
def test_a_paused_old_leader_that_wakes_up_changes_nothing(tmp_path, etcd_server):
    """SIGSTOP the leader; its standby takes over and forms a round when a worker is
    SIGKILLed; SIGCONT the old leader: its fence fails, it exits 3 naming the new
    leader and writes nothing; the job finishes exact under the new leader."""
    job_id = f"t{uuid.uuid4().hex[:10]}"
    keys = JobKeys(job_id)
    out = tmp_path / "out"
    out.mkdir()
    secret = {"ELASTIC_JOB_SECRET": uuid.uuid4().hex * 2}
    hold_at(out / "pause", 10)  # training holds at step 10: the takeover lands mid-run
    old = ElasticRun(_args(etcd_server, job_id, out), tmp_path / "old", env=secret).start()
    new = ElasticRun(_args(etcd_server, job_id, out, "--standby"), tmp_path / "new", env=secret)
    try:
        _train_to(etcd_server, keys, out, 10, "training under the first leader")
        new.start()
        new.wait_event("standing_by", timeout=30)
        assert old.proc is not None
        os.kill(old.proc.pid, signal.SIGSTOP)
        leading = new.wait_event("leading", timeout=30)
        assert leading["how"] == "adopted" and leading["adopted"] == 2 and leading["term"] == 2
        assert str(old.proc.pid) in leading["previous"]
        rounds_before = len(old.events("round_formed"))

        victim = _kill_rank(etcd_server, keys, new, 1)
        formed = new.wait_event("round_formed", lambda e: victim not in e["members"], timeout=40)
        plan = Plan.from_json(_read(etcd_server, keys.round) or b"")
        assert plan.term == 2 and plan.round_id == formed["round"]
        # Training goes on in the new round (its rank 0 publishes progress).
        _train_to(etcd_server, keys, out, 30, "training in the new leader's round")

        os.kill(old.proc.pid, signal.SIGCONT)
        assert old.wait(timeout=30) == 3, old.stderr_tail()
        last = old.stderr_tail(1)
        assert "no longer leads" in last and f"pid {new.proc.pid}" in last, last  # type: ignore[union-attr]
        assert old.events("leadership_lost")
        assert len(old.events("round_formed")) == rounds_before  # it published nothing
        leader = DriverRecord.from_json(_read(etcd_server, keys.driver) or b"")
        assert leader.term == 2 and leader.pid == new.proc.pid  # type: ignore[union-attr]
        assert Plan.from_json(_read(etcd_server, keys.round) or b"").term == 2

        (out / "pause").unlink()
        assert new.wait(timeout=90) == 0, new.stderr_tail()
        assert not new.events("job_failed")
    finally:
        if old.proc is not None and old.proc.poll() is None:
            os.kill(old.proc.pid, signal.SIGCONT)
        new.stop()
        old.stop()
    check_exact_sum(out, SAMPLES, EPOCHS)


def _train_to(etcd_server, keys: JobKeys, out, commits: int, what: str) -> None:
    """Let the held job train up to ``commits`` and hold there; return once its rank 0
    published that count. The job's speed does not matter: it cannot run past it."""
    hold_at(out / "pause", commits)
    wait_until(lambda: committed(etcd_server.url, keys.job_id) >= commits, 40, what)


def _finish_in_the_adopted_round(run: ElasticRun, out) -> None:
    """Release the held job: it ends 0 in the round its new driver adopted."""
    (out / "pause").unlink()
    assert run.wait(timeout=90) == 0, run.stderr_tail()
    assert not run.events("round_formed")  # the round was whole: nothing re-formed


def _check_one_world(out) -> None:
    """Exact, and one world of 2 from the first step to the last."""
    results = check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
    assert results[0]["sizes"] == [[2, 1]]


@pytest.mark.timeout(150)
def test_a_standby_takes_over_a_sigkilled_leader_then_a_worker_dies(tmp_path, etcd_server):
    """SIGKILL the leader: the agents keep its workers training, the standby adopts
    them; a worker SIGKILLed under the new leader is replaced as if nothing happened.
    Both drivers name one --checkpoint-dir: the standby shares the job's folder (not a
    second job) and holds it once it leads."""
    job_id = f"t{uuid.uuid4().hex[:10]}"
    keys = JobKeys(job_id)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    secret = {"ELASTIC_JOB_SECRET": uuid.uuid4().hex * 2}
    folder = ("--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0.5")
    old = ElasticRun(_args(etcd_server, job_id, out, *folder), tmp_path / "old", env=secret)
    new = ElasticRun(
        _args(etcd_server, job_id, out, *folder, "--standby"), tmp_path / "new", env=secret
    )
    # Training is held at known steps: however fast the machine, the takeover and the
    # kill land mid-run.
    hold_at(out / "pause", 0)
    old.start()
    try:
        old.wait_event("round_formed", timeout=60)
        new.start()
        new.wait_event("standing_by", timeout=30)
        assert old.proc is not None
        os.kill(old.proc.pid, signal.SIGKILL)
        leading = new.wait_event("leading", timeout=30)
        assert leading["how"] == "adopted" and leading["adopted"] == 2 and leading["term"] == 2
        assert new.proc is not None
        wait_until(
            lambda: _owner_pid(ckpt) == new.proc.pid, 30, "the folder held by the new leader"
        )
        _train_to(etcd_server, keys, out, 20, "training under the new leader")
        victim = _kill_rank(etcd_server, keys, new, 1)
        new.wait_event("worker_failed", lambda e: e["worker"] == victim, timeout=40)
        formed = new.wait_event("round_formed", lambda e: victim not in e["members"], timeout=40)
        assert Plan.from_json(_read(etcd_server, keys.round) or b"").round_id >= formed["round"]
        (out / "pause").unlink()
        assert new.wait(timeout=90) == 0, new.stderr_tail()
    finally:
        new.stop()
        old.stop()
    check_exact_sum(out, SAMPLES, EPOCHS)


@pytest.mark.timeout(150)
def test_a_standby_taking_over_while_discovery_lists_no_host_keeps_the_workers(
    tmp_path, etcd_server
):
    """A driver that takes the job over while its discovery script lists no host keeps
    the hosts its adopted workers run on: dropping them would stop every worker and
    lose the committed state (as the leader before it kept them)."""
    job_id = f"t{uuid.uuid4().hex[:10]}"
    keys = JobKeys(job_id)
    out = tmp_path / "out"
    out.mkdir()
    secret = {"ELASTIC_JOB_SECRET": uuid.uuid4().hex * 2}
    script, hosts = hosts_file_discovery(tmp_path, "localhost:2\n")
    found = ("--host-discovery-script", str(script), "--discovery-interval", "0.2")
    old = ElasticRun(_args(etcd_server, job_id, out, *found), tmp_path / "old", env=secret)
    new = ElasticRun(
        _args(etcd_server, job_id, out, *found, "--standby"), tmp_path / "new", env=secret
    )
    hold_at(out / "pause", 0)
    old.start()
    try:
        old.wait_event("round_formed", timeout=60)
        _train_to(etcd_server, keys, out, 20, "training under the first leader")
        write_hosts(hosts, "")
        old.wait_event("waiting", lambda e: "keeps its 1 host" in e["what"], timeout=30)
        new.start()
        new.wait_event("standing_by", timeout=30)
        assert old.proc is not None
        os.kill(old.proc.pid, signal.SIGKILL)
        leading = new.wait_event("leading", timeout=30)
        assert leading["how"] == "adopted" and leading["adopted"] == 2
        said = new.wait_event("waiting", lambda e: "lists none" in e["what"], timeout=30)
        assert "(the job keeps its 1 host meanwhile)" in said["what"], said
        assert new.events("worker_stopping") == []
        write_hosts(hosts, "localhost:2\n")
        _finish_in_the_adopted_round(new, out)
        assert new.events("worker_stopping") == new.events("state_lost") == []
    finally:
        new.stop()
        old.stop()
    _check_one_world(out)


@pytest.mark.timeout(150)
def test_a_driver_sigkilled_mid_run_and_started_again_adopts_the_job(tmp_path, etcd_server):
    """Training goes on while no driver runs; the same command started again adopts
    the job (its workers keep their state) and it finishes exact."""
    job_id = f"t{uuid.uuid4().hex[:10]}"
    keys = JobKeys(job_id)
    out = tmp_path / "out"
    out.mkdir()
    secret = {"ELASTIC_JOB_SECRET": uuid.uuid4().hex * 2}
    # Training is held at known steps: however fast the machine, the driver dies mid-run
    # and the job is still running when adopted.
    hold_at(out / "pause", 0)
    first = ElasticRun(_args(etcd_server, job_id, out), tmp_path / "first", env=secret).start()
    again = ElasticRun(_args(etcd_server, job_id, out), tmp_path / "again", env=secret)
    try:
        first.wait_event("round_formed", timeout=60)
        assert first.proc is not None
        os.kill(first.proc.pid, signal.SIGKILL)
        _train_to(etcd_server, keys, out, 30, "training with no driver")
        wait_until(lambda: _read(etcd_server, keys.driver) is None, 20, "the leader key to lapse")
        again.start()
        leading = again.wait_event("leading", timeout=30)
        assert leading["how"] == "adopted" and leading["adopted"] == 2 and leading["term"] == 2
        _finish_in_the_adopted_round(again, out)
    finally:
        again.stop()
        first.stop()
    _check_one_world(out)


@pytest.mark.timeout(150)
def test_a_new_driver_supervises_the_ps_shards_it_adopted(tmp_path, etcd_server):
    """The ps shards outlive their driver's SIGKILL (their agent runs them); the driver
    started again supervises them: a shard SIGKILLed under it is restarted from its
    checkpoint, and training converges."""
    from tests.system.ps.test_jobs import PS_LINEAR, check_converged, shard_pid

    job_id = f"t{uuid.uuid4().hex[:10]}"
    out, ckpt, hold = tmp_path / "out", tmp_path / "ckpt", tmp_path / "hold"
    out.mkdir()
    args = [
        "-np",
        "2",
        "--min-np",
        "1",
        "--num-ps",
        "2",
        "--ps-checkpoint-dir",
        str(ckpt),
        "--ps-checkpoint-interval",
        "0.3",
        "--rendezvous",
        etcd_server.url,
        "--job-id",
        job_id,
        "python",
        str(PS_LINEAR),
        str(out),
        "--steps",
        "300",
        "--pause-while",
        str(hold),
    ]
    secret = {"ELASTIC_JOB_SECRET": uuid.uuid4().hex * 2}
    first = ElasticRun(args, tmp_path / "first", env=secret).start()
    again = ElasticRun(args, tmp_path / "again", env=secret)
    try:
        first.wait_event("checkpoint_written", timeout=60)
        hold.write_text("")
        assert first.proc is not None
        os.kill(first.proc.pid, signal.SIGKILL)
        keys = JobKeys(job_id)
        wait_until(lambda: _read(etcd_server, keys.driver) is None, 20, "the leader key to lapse")
        again.start()
        again.wait_event("leading", lambda e: e["how"] == "adopted", timeout=30)
        os.kill(shard_pid(first, 1), signal.SIGKILL)
        again.wait_event("ps_restarted", lambda e: e["shard"] == 1, timeout=40)
        again.wait_event("ps_started", lambda e: e["shard"] == 1, timeout=40)
        hold.unlink()
        assert again.wait(timeout=100) == 0, again.stderr_tail()
    finally:
        again.stop()
        first.stop()
    check_converged(out, 300)


TAKEOVER_BOUND_S = BEAT_SILENCE + BEAT_INTERVAL + 6.0
"""Cut of the leader's host to its standby leading: the standby ends the leader's lease
once its beat has been silent for ``BEAT_SILENCE`` (a beat every ``BEAT_INTERVAL``), then
adopts the job (well under a second idle: ``benchmarks/failover_bench.py``); the 6 s
are slack for a loaded 2-core machine running three test hosts and etcd."""


def _kill_on_hosts(run: ElasticRun, hosts, worker: str) -> None:
    """SIGKILL ``worker``, which ``run`` (a driver on a test host) started or adopted: its
    events name the worker's host and its pid there."""
    started = next(
        e
        for e in reversed(run.events())
        if e["kind"] in ("worker_started", "worker_adopted") and e["worker"] == worker
    )
    host = next(h for h in hosts if h.address == started["host"])
    os.kill(host.pid_here(started["pid"]), signal.SIGKILL)


def _revision(cluster) -> int:
    with open_store(cluster.url) as store:
        return store.revision()


def _terms_written_since(cluster, keys: JobKeys, since: int) -> list[tuple[str, int]]:
    """``(key, term)`` of every value written under the job's keys after revision
    ``since`` (up to now) that carries a leader term (plans, assignments, the leader's
    record and state). The history is read through a watch, up to a marker put beside
    the job's keys (outside its prefix: no process of the job sees it)."""
    beside = keys.prefix.rstrip("/")
    stamped = []
    with open_store(cluster.url) as store:
        end = store.put(f"{beside}~checked", b"")
        with store.watch_prefix(beside, start_revision=since + 1) as watch:
            while (event := watch.get(timeout=10)) is not None and event.revision < end:
                record = None
                if event.type != "delete":
                    with contextlib.suppress(ValueError):
                        record = json.loads(event.value)
                if isinstance(record, dict) and "term" in record:
                    stamped.append((event.key, record["term"]))
            assert event is not None, "the store's history ended before the marker"
    return stamped


@pytest.mark.chaos
@pytest.mark.timeout(150)
def test_the_leaders_host_cut_a_standby_on_another_host_takes_over(three_hosts, tmp_path):
    """The leading driver runs on host A, its agents and workers on B and C (over ssh),
    etcd on C, a standby on B. A's link is cut (no FIN, no RST): the standby leads
    within ``TAKEOVER_BOUND_S``, adopts both workers, training goes on; a worker
    SIGKILLed under it is replaced. A's link restored: the old driver, alive all along,
    finds it no longer leads and exits 3 having written nothing; the job finishes exact."""
    a, b, c = three_hosts
    job_id = f"t{uuid.uuid4().hex[:10]}"
    keys = JobKeys(job_id)
    out = tmp_path / "out"
    out.mkdir()
    env = {**three_hosts.env(), "ELASTIC_JOB_SECRET": uuid.uuid4().hex * 2}
    cluster = EtcdCluster(1, tmp_path / "etcd", hosts=[c]).start()
    spread = ("-H", f"{b.address}:1,{c.address}:1", "--launcher", "ssh")
    old = ElasticRun(_args(cluster, job_id, out, *spread), tmp_path / "old", env=env, host=a)
    new = ElasticRun(
        _args(cluster, job_id, out, *spread, "--standby"), tmp_path / "new", env=env, host=b
    )
    hold_at(out / "pause", 10)  # training holds at step 10: the cut lands mid-run
    try:
        old.start()
        _train_to(cluster, keys, out, 10, "training under the first leader")
        new.start()
        new.wait_event("standing_by", timeout=30)
        rounds_before = len(old.events("round_formed"))
        cut_at = time.time()
        a.cut()
        leading = new.wait_event("leading", timeout=TAKEOVER_BOUND_S)
        assert leading["t"] - cut_at <= TAKEOVER_BOUND_S, leading
        assert leading["how"] == "adopted" and leading["adopted"] == 2 and leading["term"] == 2
        _train_to(cluster, keys, out, 30, "training under the new leader")

        plan = Plan.from_json(_read(cluster, keys.round) or b"")
        victim = plan.members[1].worker_id
        _kill_on_hosts(new, three_hosts, victim)
        formed = new.wait_event("round_formed", lambda e: victim not in e["members"], timeout=40)
        assert Plan.from_json(_read(cluster, keys.round) or b"").round_id >= formed["round"]
        _train_to(cluster, keys, out, 50, "training in the new leader's round")

        assert old.proc is not None and old.proc.poll() is None  # alive, cut off
        restored_at = _revision(cluster)
        a.restore()
        assert old.wait(timeout=30) == 3, old.stderr_tail()
        # Nothing the old leader could write (all fenced) reached the store: every term
        # stamped since its link came back is the new leader's.
        stale = [(k, t) for k, t in _terms_written_since(cluster, keys, restored_at) if t != 2]
        assert not stale, stale
        leader = DriverRecord.from_json(_read(cluster, keys.driver) or b"")
        assert leader.term == 2 and leader.host == b.name
        last = old.stderr_tail(1)
        assert "no longer leads" in last and f"on host {b.name}" in last, last
        assert old.events("leadership_lost")
        assert len(old.events("round_formed")) == rounds_before  # it published nothing
        assert Plan.from_json(_read(cluster, keys.round) or b"").term == 2

        (out / "pause").unlink()
        assert new.wait(timeout=90) == 0, new.stderr_tail()
        assert not new.events("job_failed")
    finally:
        a.restore()
        new.stop()
        old.stop()
        cluster.stop()
    check_exact_sum(out, SAMPLES, EPOCHS)


def _chaos_with_driver_kills(tmp_path, etcd_server, driver_kills: int, worker_kills: int):
    """SIGKILL the leading driver ``driver_kills`` times (a fresh standby waits each
    time) and workers ``worker_kills`` times (under whichever driver leads), each kill
    after the job trained on; the job finishes exact under its last leader."""
    rng = random.Random(driver_kills * 10 + worker_kills)
    job_id = f"t{uuid.uuid4().hex[:10]}"
    keys = JobKeys(job_id)
    out = tmp_path / "out"
    out.mkdir()
    secret = {"ELASTIC_JOB_SECRET": uuid.uuid4().hex * 2}
    args = _args(etcd_server, job_id, out)
    args[1] = "3"  # -np 3
    args[2:2] = ["--min-np", "2"]
    kills = ["driver"] * driver_kills + ["worker"] * worker_kills
    rng.shuffle(kills)
    hold_at(out / "pause", 0)
    runs = [ElasticRun(args, tmp_path / "d0", env=secret).start()]
    try:
        for n, kind in enumerate(kills, start=1):
            _train_to(etcd_server, keys, out, 30 * n, f"training before kill {n}")
            leader = runs[-1]
            if kind == "driver":
                standby = ElasticRun(["--standby", *args], tmp_path / f"d{n}", env=secret)
                runs.append(standby.start())
                standby.wait_event("standing_by", timeout=30)
                assert leader.proc is not None
                leader.proc.kill()
                standby.wait_event("leading", lambda e: e["how"] == "adopted", timeout=30)
            else:
                plan = Plan.from_json(_read(etcd_server, keys.round) or b"")
                victim = _kill_rank(etcd_server, keys, leader, rng.randrange(plan.size))
                leader.wait_event(
                    "round_formed", lambda e, v=victim: v not in e["members"], timeout=40
                )
        (out / "pause").unlink()
        last = runs[-1]
        assert last.wait(timeout=120) == 0, last.stderr_tail()
    finally:
        for run in reversed(runs):
            run.stop()
    check_exact_sum(out, SAMPLES, EPOCHS)


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_chaos_kills_the_driver_and_workers_bounded(tmp_path, etcd_server):
    _chaos_with_driver_kills(tmp_path, etcd_server, driver_kills=2, worker_kills=2)


@pytest.mark.chaos
@pytest.mark.long
@pytest.mark.timeout(900)
def test_chaos_kills_the_driver_3_times_and_workers_5_times(tmp_path, etcd_server):
    _chaos_with_driver_kills(tmp_path, etcd_server, driver_kills=3, worker_kills=5)
