"""Checkpoints a stranger could have touched, with real shard processes and a real
``elastic-run``: a well checksummed but malformed checkpoint, or one whose manifest
names a file outside its directory, is skipped for the previous complete one; a
checkpoint directory another user owns or can write is refused, by the driver before it
starts anything and by a shard on its own, with one line naming the directory and the fix."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ps.shard import checkpoint as ck
from rendezvous.private_dir import InsecureDirectoryError, check_private_dir, make_private_dir
from tests.ps.test_checkpoint_files import _huge_rows, _parsed_file, write_crafted
from tests.ps.test_failures import run_shard_to_its_end
from tests.support.paths import ROOT
from tests.support.ps.harness import PSJob

NOBODY = pwd.getpwnam("nobody").pw_uid


def _foreign_dir(tmp_path: Path) -> Path:
    """A directory this user does not own: made and given away when running as root,
    else the root directory (owned by root)."""
    if os.geteuid() != 0:
        return Path("/")
    d = tmp_path / "planted-by-nobody"
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    return d


def _open_dir(tmp_path: Path) -> Path:
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    return d


@pytest.mark.timeout(120)
def test_a_shard_skips_malformed_and_planted_checkpoints(embedded_server, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
    with PSJob(embedded_server, tmp_path / "first", 1, checkpoint_dir=ckpt).start() as job:
        client = job.client()
        client.init({"w": np.zeros((10, 4))}, optimizer="adam", lr=0.1)
        for _ in range(3):
            client.push({"w": np.ones((10, 4))})
        job.wait_checkpoint(min_step=3)
        expected = client.pull()["w"]
    good = ck.load_newest(ckpt)
    assert good is not None and good.step == 3
    header, tensors = _parsed_file(ckpt, good.checkpoint_id)
    no_variables = {k: v for k, v in header.items() if k != "variables"}
    crafted = [
        write_crafted(ckpt, good.checkpoint_id + 1, no_variables, tensors),
        write_crafted(ckpt, good.checkpoint_id + 2, *_huge_rows(header, tensors)),
    ]
    # the newest: a well-formed file of other weights, named from outside its directory
    planted = [(m, np.full_like(a, 7.0)) for m, a in tensors]
    os.makedirs(ck.checkpoint_dir(ckpt, good.checkpoint_id + 3))
    write_crafted(ckpt, good.checkpoint_id + 3, header, planted, "../planted.bin")
    with PSJob(embedded_server, tmp_path / "second", 1, checkpoint_dir=ckpt).start() as job:
        client = job.client()
        assert job.shard_status(0)["step"] == 3
        np.testing.assert_array_equal(client.pull()["w"], expected)
        log = job.shard_log(0)
    for path in crafted:
        assert f"{path}: malformed contents" in log
    assert "not the shard files" in log and "Traceback" not in log


def _elastic_run(tmp_path: Path, checkpoint_dir: Path) -> subprocess.CompletedProcess:
    events = tmp_path / "events.jsonl"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "driver.cli",
            "--events",
            str(events),
            "-np",
            "1",
            "--num-ps",
            "1",
            "--ps-checkpoint-dir",
            str(checkpoint_dir),
            "python",
            "-c",
            "pass",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("kind", ["foreign", "open"])
def test_the_driver_refuses_a_checkpoint_dir_others_control_before_starting(tmp_path, kind):
    directory = _foreign_dir(tmp_path) if kind == "foreign" else _open_dir(tmp_path)
    run = _elastic_run(tmp_path, directory)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and str(directory) in lines[0], run.stderr
    assert ("chown" if kind == "foreign" else "chmod go-w") in lines[0]
    events = tmp_path / "events.jsonl"
    assert not events.exists() or "job_started" not in events.read_text()


@pytest.mark.parametrize("kind", ["foreign", "open"])
def test_a_shard_refuses_a_checkpoint_dir_others_control(tmp_path, kind):
    directory = _foreign_dir(tmp_path) if kind == "foreign" else _open_dir(tmp_path)
    run = run_shard_to_its_end(
        "--index", "0", "--num-shards", "1", "--checkpoint-dir", str(directory)
    )
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and str(directory) in lines[0], run.stderr
    assert ("chown" if kind == "foreign" else "chmod go-w") in lines[0]


def test_private_dir_rules(tmp_path):
    made = tmp_path / "a" / "b"
    make_private_dir(str(made), "--dir")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    make_private_dir(str(made), "--dir")  # an existing own directory is fine
    os.chmod(made, 0o750)
    check_private_dir(str(made), "--dir")  # readable by the group: fine
    os.chmod(made, 0o770)
    with pytest.raises(InsecureDirectoryError, match=r"writable by its group \(mode 770\)"):
        check_private_dir(str(made), "--dir")
    with pytest.raises(InsecureDirectoryError, match="not a directory"):
        check_private_dir("/dev/null", "--dir")
    with pytest.raises(InsecureDirectoryError, match="cannot examine"):
        check_private_dir(str(tmp_path / "missing"), "--dir")
    if os.geteuid() == 0:  # a link someone else owns can be pointed elsewhere later
        own = tmp_path / "own"
        own.mkdir()
        link = tmp_path / "link"
        link.symlink_to(own)
        os.lchown(link, NOBODY, NOBODY)
        with pytest.raises(InsecureDirectoryError, match="symbolic link owned by nobody"):
            check_private_dir(str(link), "--dir")
