"""Parameter-server failures with real processes and real SIGKILL: a shard killed mid-run
(async and sync), a corrupted checkpoint file, a restore into another shard count, a
restart of the whole job from its checkpoint dir, size limits, secrets, deadlines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from ps.client import PSClient
from ps.errors import PSConfigError, PSUnavailableError
from ps.settings import ClientSettings
from ps.shard import checkpoint as ck
from rendezvous.errors import RendezvousAuthError
from tests.support.jobs import wait_until
from tests.support.ps import worker as pw
from tests.support.ps.harness import ROOT, PSJob


def _result(path):
    with open(path) as f:
        return json.load(f)


def _gd(steps: int, lr: float) -> dict:
    """``steps`` of full-batch gradient descent: what sync workers that all use the full
    data must end with, whatever rollbacks happened on the way."""
    X, y = pw.make_problem()
    params = pw.initial_params()
    for _ in range(steps):
        g = pw.grad(params, X, y)
        params = {k: params[k] - lr * ((g[k] + g[k]) / 2) for k in params}
    return params


def full_data_sync_workers(job: PSJob, tmp_path, steps: int, lr: float, *extra) -> list:
    """Two sync workers of ``steps`` on the full data (what ``check_gd`` checks), with
    ``extra`` arguments (``{rank}`` in one is the worker's rank); their result files."""
    outs = [tmp_path / f"out{r}.json" for r in range(2)]
    for r in range(2):
        job.worker(
            *("lsq", "--steps", steps, "--rank", r, "--size", 2, "--data", "full"),
            *("--lr", lr, "--out", outs[r]),
            *(str(a).format(rank=r) for a in extra),
        )
    return outs


def check_gd(outs, steps: int, lr: float) -> None:
    """Each worker ended at ``steps`` with exactly the parameters of plain gradient descent."""
    expected = _gd(steps, lr)
    for out in outs:
        got = _result(out)
        assert got["step"] == steps
        np.testing.assert_allclose(got["w"], expected["w"], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got["b"], expected["b"], rtol=1e-10, atol=1e-12)


def test_shard_killed_mid_run_in_sync_mode_rolls_every_shard_back(embedded_server, tmp_path):
    steps, lr = 300, 0.05
    ckpt = str(tmp_path / "ckpt")
    with PSJob(
        embedded_server, tmp_path, 2, "sync", checkpoint_dir=ckpt, checkpoint_interval=0.2
    ).start() as job:
        outs = full_data_sync_workers(job, tmp_path, steps, lr)
        job.wait_checkpoint(min_step=20)
        assert job.shard_status(1)["step"] < steps - 50  # mid-run
        job.kill_shard(1)
        job.restart_shard(1)  # what the driver does: same command line
        job.wait_workers(timeout=90)
        statuses = [job.shard_status(i) for i in range(2)]
        log0 = job.shard_log(0)
    check_gd(outs, steps, lr)
    assert [s["step"] for s in statuses] == [steps, steps]
    # shard 0 rolled every shard back to one checkpoint, under a new generation
    assert statuses[0]["generation"] == statuses[1]["generation"]
    assert "-" in statuses[0]["generation"] and "restored checkpoint" in log0


def test_shard_killed_mid_run_in_async_mode_is_a_pause(embedded_server, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    X, y = pw.make_problem()
    with PSJob(
        embedded_server, tmp_path, 2, "async", checkpoint_dir=ckpt, checkpoint_interval=0.2
    ).start() as job:
        outs = [tmp_path / f"out{r}.json" for r in range(2)]
        for r in range(2):
            job.worker(
                "lsq",
                "--steps",
                400,
                "--rank",
                r,
                "--size",
                2,
                "--lr",
                0.05,
                "--optimizer",
                "momentum",
                "--out",
                outs[r],
            )
        job.wait_checkpoint(min_step=30)
        assert job.shard_status(0)["step"] < 350  # mid-run
        job.kill_shard(0)  # shard 0 is also the checkpoint coordinator
        job.restart_shard(0)
        job.wait_workers(timeout=90)
        final = job.client().pull()
        job.wait_checkpoint(min_step=400)  # the restarted coordinator checkpoints again
        log0 = job.shard_log(0)
    assert "loaded checkpoint" in log0
    assert pw.loss(final, X, y) < 1e-3 * pw.loss(pw.initial_params(), X, y)


def _count_job(embedded_server, tmp_path, num_shards, mode="async", **kw):
    return PSJob(
        embedded_server,
        tmp_path,
        num_shards,
        mode,
        checkpoint_dir=str(tmp_path / "ckpt"),
        checkpoint_interval=0.1,
        **kw,
    )


def _push_until_checkpoint(job, client, target: int, ones) -> dict:
    while client.step < target:
        client.push(ones)
    return job.wait_checkpoint(min_step=target)


def test_corrupted_checkpoint_file_falls_back_to_the_previous_one(embedded_server, tmp_path):
    ones = {"w": np.ones((40, 5))}
    with _count_job(embedded_server, tmp_path, 2).start() as job:
        c = job.client()
        c.init({"w": np.zeros((40, 5))}, optimizer="sgd", lr=1.0)
        first = _push_until_checkpoint(job, c, 5, ones)
        second = _push_until_checkpoint(job, c, first["step"] + 5, ones)
        for i in range(2):
            job.kill_shard(i)
        bad = os.path.join(
            ck.checkpoint_dir(str(tmp_path / "ckpt"), second["checkpoint_id"]),
            ck.shard_filename(1, 2),
        )
        with open(bad, "r+b") as f:
            f.seek(100)
            f.write(b"\x00garbage\x00")
        job.start()  # the whole job again, on the same checkpoint dir
        c2 = job.client()
        values = c2.pull()
        logs = job.shard_log(0) + job.shard_log(1)
    assert c2.step == first["step"]
    np.testing.assert_array_equal(values["w"], -first["step"] * np.ones((40, 5)))
    assert bad in logs and "skipping checkpoint" in logs


def _momentum_sequence(n: int, mu: float = 0.5) -> float:
    """The value after ``n`` momentum steps (lr 1) with gradient 1, starting at 0."""
    v = p = 0.0
    for _ in range(n):
        v = mu * v + 1.0
        p -= v
    return p


def test_restore_into_a_different_number_of_shards(embedded_server, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    ones = {"w": np.ones((30, 4)), "b": np.ones(3)}
    with PSJob(
        embedded_server, tmp_path, 2, "async", checkpoint_dir=ckpt, checkpoint_interval=0.1
    ).start() as job:
        c = job.client()
        c.init(
            {"w": np.zeros((30, 4)), "b": np.zeros(3)}, optimizer="momentum", lr=1.0, momentum=0.5
        )
        _push_until_checkpoint(job, c, 4, ones)
    with PSJob(
        embedded_server, tmp_path, 3, "async", checkpoint_dir=ckpt, checkpoint_interval=0.1
    ).start() as job3:
        c3 = job3.client()
        values = c3.pull()
        assert c3.step == 4
        np.testing.assert_allclose(values["w"], np.full((30, 4), _momentum_sequence(4)))
        np.testing.assert_allclose(values["b"], np.full(3, _momentum_sequence(4)))
        holders = {
            i
            for i in range(3)
            for v in job3.shard_status(i)["variables"]
            if v["slice"]["name"] == "w"
        }
        assert holders == {0, 1, 2}
        c3.push(ones)  # the momentum slots were re-cut too: the sequence continues
        np.testing.assert_allclose(c3.pull()["w"], np.full((30, 4), _momentum_sequence(5)))


def _adam_reference(steps: int) -> np.ndarray:
    from ps.optimizers import Adam

    opt, p = Adam(0.1), np.zeros((20, 3))
    slots = opt.slots(p)
    for k in range(steps):
        p = opt.apply(p, np.full((20, 3), k + 1.0), slots)
    return p


def test_whole_job_restart_resumes_from_the_checkpoint_dir(embedded_server, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    with PSJob(
        embedded_server, tmp_path, 2, "sync", checkpoint_dir=ckpt, checkpoint_interval=0.1
    ).start() as job:
        c = job.client()
        c.init({"w": np.zeros((20, 3))}, optimizer="adam", lr=0.1)
        for k in range(6):
            c.push({"w": np.full((20, 3), k + 1.0)})
        job.wait_checkpoint(min_step=6)
        for i in range(2):
            job.kill_shard(i)
    with PSJob(embedded_server, tmp_path, 2, "sync", checkpoint_dir=ckpt).start() as job2:
        c2 = job2.client()
        np.testing.assert_allclose(c2.pull()["w"], _adam_reference(6))
        assert c2.step == 6
        c2.init({"w": np.ones((20, 3))}, optimizer="sgd")  # keeps what exists
        assert c2.push({"w": np.full((20, 3), 7.0)}) == 7  # Adam's slots were restored
        np.testing.assert_allclose(c2.pull()["w"], _adam_reference(7))


def test_largest_tensor_of_a_64mib_model_moves_without_a_size_error(embedded_server, tmp_path):
    big = np.random.default_rng(0).normal(size=(4096, 4096)).astype(np.float32)  # 64 MiB
    with PSJob(embedded_server, tmp_path, 1, split_threshold=1 << 30).start() as job:
        c = job.client()
        c.init({"big": big}, optimizer="sgd", lr=1.0)
        assert c.push({"big": np.ones_like(big)}) == 1
        np.testing.assert_array_equal(c.pull()["big"], big - 1)


def test_wrong_secret_is_refused_and_a_shard_needs_the_secret(embedded_server, tmp_path):
    with PSJob(embedded_server, tmp_path, 1).start() as job:
        bad = PSClient([job.addresses[0]], "not-the-secret", ClientSettings(retry_deadline=2))
        try:
            with pytest.raises(RendezvousAuthError):
                bad.pull()
        finally:
            bad.close()
        environ = job.env()
        del environ["ELASTIC_JOB_SECRET"]
        run = subprocess.run(
            job.shard_argv(0),
            env=environ,
            cwd=str(ROOT),
            timeout=60,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 2 and "ELASTIC_JOB_SECRET" in run.stderr


def test_client_gives_up_after_its_deadline_with_a_typed_error(embedded_server, tmp_path):
    with PSJob(embedded_server, tmp_path, 1).start() as job:
        c = job.client(retry_deadline=1.0)
        c.init({"w": np.zeros(3)})
        job.kill_shard(0)
        with pytest.raises(PSUnavailableError, match="shard 0"):
            c.push({"w": np.ones(3)})


def test_connect_finds_the_shards_or_says_the_job_has_none(embedded_server, tmp_path):
    from ps.client import connect

    with PSJob(embedded_server, tmp_path, 2).start() as job:
        client = connect(environ=job.env())
        try:
            client.init({"w": np.zeros(4)})
            assert client.push({"w": np.ones(4)}) == 1 and client.num_shards == 2
        finally:
            client.close()
        with pytest.raises(PSConfigError, match="no parameter-server shards"):
            connect(ClientSettings(connect_timeout=0.3), environ=job.env(ELASTIC_JOB_ID="other"))
    with pytest.raises(PSConfigError, match="elastic-run --num-ps"):
        connect(environ={})


def run_shard_to_its_end(*args: str) -> subprocess.CompletedProcess:
    """``python -m ps.server ARGS`` with a secret and no store, run to its end
    (for the ways it refuses to start)."""
    environ = {**os.environ, "ELASTIC_JOB_SECRET": "s", "PYTHONPATH": str(ROOT)}
    environ.pop("ELASTIC_RENDEZVOUS", None)
    environ.pop("ELASTIC_JOB_ID", None)
    return subprocess.run(
        [sys.executable, "-m", "ps.server", *args],
        env=environ,
        cwd=str(ROOT),
        timeout=60,
        capture_output=True,
        text=True,
    )


def test_multi_shard_checkpoints_need_the_store(tmp_path):
    run = run_shard_to_its_end(
        "--index", "0", "--num-shards", "2", "--checkpoint-dir", str(tmp_path)
    )
    assert run.returncode == 2 and "ELASTIC_RENDEZVOUS" in run.stderr


def test_chunked_transfers_over_the_bulk_port_which_refuses_a_wrong_secret(
    embedded_server, tmp_path
):
    from ps.client.bulk import BulkClient
    from ps.client.link import ShardLink
    from ps.protocol import Hello, Part

    values = np.random.default_rng(1).normal(size=(300, 70))
    with PSJob(embedded_server, tmp_path, 2).start() as job:
        # chunked uploads and downloads through the bulk port, in many small parts
        c = job.client(chunk_bytes=16 << 10, lanes=3)
        c.init({"v": values}, optimizer="sgd", lr=0.5)
        assert c.push({"v": np.ones_like(values)}) == 1
        np.testing.assert_array_equal(c.pull()["v"], values - 0.5)
        # another client sees the same values, in parts of another size
        b = job.client(chunk_bytes=8 << 10, lanes=2)
        np.testing.assert_array_equal(b.pull()["v"], values - 0.5)
        link = ShardLink(0, job.addresses[0], job.secret)
        try:
            port = Hello.from_dict(link.request("Hello")[0]).bulk_port
        finally:
            link.close()
        intruder = BulkClient(f"127.0.0.1:{port}", "wrong", lanes=1, timeout=5)
        try:
            with pytest.raises(RendezvousAuthError):
                intruder.get(Part("x", 0, 1), [memoryview(bytearray(1))])
        finally:
            intruder.close()


def test_a_shard_announces_itself_only_in_the_store(embedded_server, tmp_path):
    """ShardInfo with ready=False as soon as it serves, then ready=True with the same pid;
    each complete checkpoint as a CheckpointRecord; nothing on stdout."""
    from rendezvous import open_store
    from rendezvous.schema.ps import ShardInfo

    ckpt = str(tmp_path / "ckpt")
    job = PSJob(embedded_server, tmp_path, 1, checkpoint_dir=ckpt, checkpoint_interval=0.1)
    store = open_store(job.store_url, job.secret)
    _, watch = store.read_and_watch(job.keys.ps_shard(0))
    try:
        with job.start():
            c = job.client()
            c.init({"w": np.zeros(3)})
            c.push({"w": np.ones(3)})
            record = job.wait_checkpoint(min_step=1)
            infos: list[ShardInfo] = []
            while not (infos and infos[-1].ready):
                event = watch.get(timeout=30)
                assert event is not None, f"no ready record, only {infos}"
                infos.append(ShardInfo.from_json(event.value))
            pid = job.shards[0].proc.pid
            log = job.shard_log(0)
    finally:
        watch.cancel()
        store.close()
    assert [(i.ready, i.pid, i.address) for i in infos] == [
        (False, pid, job.addresses[0]),
        (True, pid, job.addresses[0]),
    ]
    assert infos[0].bulk_address.startswith("127.0.0.1:")
    assert record["dir"] == ckpt and record["step"] >= 1
    assert ck.is_complete(ckpt, record["checkpoint_id"])
    assert "ELASTIC_PS_" not in log


def _outcome(port: int, proc: subprocess.Popen) -> str | None:
    """ "exited", "serving" once something accepts on ``port``, else None."""
    if proc.poll() is not None:
        return "exited"
    with socket.socket() as s:
        return "serving" if s.connect_ex(("127.0.0.1", port)) == 0 else None


def _shard_alone(tmp_path, *args: str) -> tuple[subprocess.Popen, int]:
    """A shard started without a store on a free port it is told (no store: nowhere to
    announce one it picks itself); tries another port if one is taken meanwhile."""
    environ = {**os.environ, "ELASTIC_JOB_SECRET": "s", "PYTHONPATH": str(ROOT)}
    for name in ("ELASTIC_RENDEZVOUS", "ELASTIC_JOB_ID"):
        environ.pop(name, None)
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with open(tmp_path / "stdout", "wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ps.server",
                    "--index",
                    "0",
                    "--num-shards",
                    "1",
                    "--bind",
                    f"127.0.0.1:{port}",
                    *args,
                ],
                env=environ,
                cwd=str(ROOT),
                stdout=out,
                stderr=subprocess.DEVNULL,
            )
        if wait_until(lambda p=proc, n=port: _outcome(n, p), 60, "the shard") == "serving":
            return proc, port
        proc.wait(timeout=10)
    raise AssertionError("no shard could bind a free port in 3 attempts")


def test_a_shard_without_a_store_serves_and_checkpoints_alone(tmp_path):
    """No ELASTIC_RENDEZVOUS: the shard serves, checkpoints to disk and prints nothing."""
    ckpt = str(tmp_path / "ckpt")
    proc, port = _shard_alone(tmp_path, "--checkpoint-dir", ckpt, "--checkpoint-interval", "0.1")
    client = PSClient([f"127.0.0.1:{port}"], "s", ClientSettings(retry_deadline=30))
    try:
        client.init({"w": np.zeros(3)})
        assert client.push({"w": np.ones(3)}) == 1
        wait_until(
            lambda: (loaded := ck.load_newest(ckpt)) is not None and loaded.step >= 1,
            30,
            "a checkpoint at step 1 on disk",
        )
    finally:
        client.close()
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    assert (tmp_path / "stdout").read_bytes() == b""
