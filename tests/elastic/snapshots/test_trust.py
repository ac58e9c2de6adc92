"""The workers' snapshots trust nothing for being in the checkpoint directory (their
skeleton is a pickle: loading a planted one runs its code): a manifest step that is no
step, a snapshot folder or a host's folder that is a link, another user's or writable
by others, a file of another user, a FIFO or a sparse file for a manifest, a manifest
whose arrays and parts disagree. Real files, FIFOs, links and owners (as root a file
can be given to ``nobody``)."""

from __future__ import annotations

import json
import logging
import os
import shutil

import numpy as np
import pytest

from elastic.errors import SnapshotError
from elastic.snapshots import files
from tests.elastic.snapshots.test_files import load, values, write_snapshot
from tests.ps.test_checkpoint_trust import (
    NOBODY,
    GiB,
    _bytes_read,
    _give_away,
    _returns_within,
)


@pytest.fixture(autouse=True)
def _each_refusal_said_again():
    """``files`` says a refused folder once per process: once per test here."""
    files._said.clear()


def _edit_manifest(folder: str, **changes) -> None:
    path = os.path.join(folder, files.MANIFEST)
    with open(path) as f:
        raw = json.load(f)
    raw.update(changes)
    with open(path, "w") as f:
        json.dump(raw, f)


def _steps(root) -> list[int]:
    return [m.step for m, _ in files.complete(str(root))]


def _said(caplog, path: str, reason: str) -> None:
    lines = [r.getMessage() for r in caplog.records if path in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0], caplog.text


@pytest.mark.parametrize("step", [-5, 2.5, "9"], ids=["negative", "float", "text"])
def test_a_manifest_step_that_is_no_step_is_refused(tmp_path, caplog, step):
    write_snapshot(tmp_path, 5, values(10), token="good")
    folder = write_snapshot(tmp_path, 7, values(10), token="bad")
    _edit_manifest(folder, step=step)
    with caplog.at_level(logging.WARNING, logger="elastic.snapshots.files"):
        assert _steps(tmp_path) == [5]
    _said(caplog, folder, f"step {step} is not an integer of at least 0")


def test_a_manifest_whose_arrays_outgrow_its_parts_is_refused_before_allocating(tmp_path, caplog):
    write_snapshot(tmp_path, 5, values(10), token="good")
    folder = write_snapshot(tmp_path, 7, values(20_000), token="bad")
    with open(os.path.join(folder, files.MANIFEST)) as f:
        leaves = json.load(f)["leaves"]
    leaves[0]["nbytes"] = 1 << 40  # a TiB: allocated whole, it would end the process
    _edit_manifest(folder, leaves=leaves)
    with caplog.at_level(logging.WARNING, logger="elastic.snapshots.files"):
        assert _steps(tmp_path) == [5]
    _said(caplog, folder, f"its arrays hold {1 << 40} bytes and its parts")


def test_a_snapshot_folder_linked_to_an_open_folder_of_nobody_is_refused(tmp_path, caplog):
    root, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    root.mkdir(mode=0o700)
    elsewhere.mkdir()
    write_snapshot(root, 5, values(10), token="good")
    planted = write_snapshot(elsewhere, 9, {"w": np.full(10, 7.0), "epoch": 99}, token="x")
    _give_away(elsewhere, 0o777)
    os.chmod(planted, 0o777)
    link = os.path.join(root, os.path.basename(planted))
    os.symlink(planted, link)
    with caplog.at_level(logging.WARNING, logger="elastic.snapshots.files"):
        assert _steps(root) == [5]
    _said(caplog, link, f"{link} is a symbolic link to {planted}, not a real folder")


@pytest.mark.parametrize("how", ["owned by nobody", "writable by others"])
def test_a_host_folder_others_control_is_not_read(tmp_path, caplog, how):
    host = tmp_path / "host-b"
    write_snapshot(host, 9, values(10))
    if how == "owned by nobody":
        _give_away(host)
    else:
        os.chmod(host, 0o757)
    with caplog.at_level(logging.WARNING, logger="elastic.snapshots.files"):
        assert files.roots(str(tmp_path)) == [str(tmp_path)]
    _said(caplog, str(host), how)


@pytest.mark.parametrize("how", ["owned by nobody", "writable by others", "a symbolic link"])
def test_a_skeleton_others_control_is_not_unpickled(tmp_path, how):
    folder = write_snapshot(tmp_path, 7, values(20_000))
    skeleton = os.path.join(folder, files.SKELETON)
    if how == "owned by nobody":
        _give_away(tmp_path / os.path.basename(folder) / files.SKELETON)
    elif how == "writable by others":
        os.chmod(skeleton, 0o606)
    else:
        elsewhere = tmp_path / "elsewhere.pkl"
        shutil.move(skeleton, elsewhere)
        os.chown(elsewhere, NOBODY, NOBODY)
        os.symlink(elsewhere, skeleton)
    with pytest.raises(SnapshotError, match=f"{skeleton} is {how}"):
        load(folder)


def test_a_fifo_for_a_manifest_is_refused_at_once(tmp_path, caplog):
    write_snapshot(tmp_path, 5, values(10), token="good")
    folder = write_snapshot(tmp_path, 7, values(10), token="fifo")
    fifo = os.path.join(folder, files.MANIFEST)
    os.unlink(fifo)
    os.mkfifo(fifo, 0o600)
    with caplog.at_level(logging.WARNING, logger="elastic.snapshots.files"):
        assert _returns_within(10.0, lambda: _steps(tmp_path), fifo) == [5]
    _said(caplog, folder, f"{fifo} is a FIFO, not a regular file")


def test_a_sparse_manifest_is_refused_unread(tmp_path, caplog):
    write_snapshot(tmp_path, 5, values(10), token="good")
    folder = write_snapshot(tmp_path, 7, values(10), token="sparse")
    manifest = os.path.join(folder, files.MANIFEST)
    os.truncate(manifest, GiB)
    before = _bytes_read()
    with caplog.at_level(logging.WARNING, logger="elastic.snapshots.files"):
        assert _steps(tmp_path) == [5]
    assert _bytes_read() - before < 16 << 20
    _said(caplog, folder, f"{manifest}: {GiB} bytes, more than the")


def test_a_sparse_part_is_refused_before_anything_is_allocated(tmp_path):
    folder = write_snapshot(tmp_path, 7, values(20_000))
    part = os.path.join(folder, files.part_name(0, 2))
    manifest = files.read_manifest(folder)
    assert manifest is not None
    os.truncate(part, GiB)
    before = _bytes_read()
    with pytest.raises(SnapshotError, match=f"{part}: {GiB} bytes, the manifest says"):
        load(folder)
    assert _bytes_read() - before < 16 << 20


def test_snapshots_written_under_an_open_umask_are_still_private(tmp_path):
    previous = os.umask(0o002)
    try:
        folder = write_snapshot(tmp_path / "host-a", 7, values(20_000))
    finally:
        os.umask(previous)
    assert files.roots(str(tmp_path)) == [str(tmp_path), str(tmp_path / "host-a")]
    assert np.array_equal(load(folder)["w"], values(20_000)["w"])
