"""Checkpoint contents are not trusted for being in the checkpoint directory: a manifest
step that is no step, a newest checkpoint below an older one's step, a folder or file
that is a symbolic link, another user's or writable by others, a FIFO, a sparse file
larger than the manifest or its header says. Each is refused in one line naming it,
and the newest credible checkpoint is loaded instead. Real files, FIFOs, links and
owners (as root a file can be given to ``nobody``), and a real shard process started
on a directory holding all of them."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from ps.shard import checkpoint as ck
from rendezvous import private_dir
from rendezvous.private_dir import PrivateFileError, open_private_file
from tests.ps.test_checkpoint_files import (
    _full,
    _parsed_file,
    _snapshots,
    _variables,
    _write,
    write_crafted,
)
from tests.support.ps.harness import PSJob

NOBODY = 65534
GiB = 1 << 30


def _bytes_read() -> int:
    """Bytes this process has read with read(2) so far (``rchar`` of /proc/self/io)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _old_and_new(root: Path, new_step: int = 9) -> tuple[dict, list[ck.FileRecord]]:
    """Checkpoint 1 (step 4, the good one) and checkpoint 2 (``new_step``) of one shard;
    the values of 1 and the file records of 2."""
    old = _variables(7)
    _write(root, 1, _snapshots(old, 1, step=4), step=4)
    return old, _write(root, 2, _snapshots(_variables(8), 1, step=new_step), step=new_step)


def _loads_checkpoint_1(root: Path, caplog, old: dict, step: int = 4) -> list[str]:
    """Load the newest: it must be checkpoint 1 with ``old``; the warnings logged."""
    with caplog.at_level(logging.WARNING, logger="ps.shard.checkpoint"):
        loaded = ck.load_newest(str(root))
    assert loaded is not None and loaded.checkpoint_id == 1, caplog.text
    assert loaded.step == step
    np.testing.assert_array_equal(_full(loaded, 1)["w"], old["w"])
    return [r.getMessage() for r in caplog.records if r.name == "ps.shard.checkpoint"]


def _one_line_about(messages: list[str], path: str, reason: str) -> None:
    said = [m for m in messages if path in m]
    assert len(said) == 1, messages
    assert "\n" not in said[0] and reason in said[0], said[0]


def _manifest_path(root, checkpoint_id: int) -> str:
    return os.path.join(ck.checkpoint_dir(str(root), checkpoint_id), ck.MANIFEST)


def _rewrite_manifest(root, checkpoint_id: int, **changes) -> None:
    """Write checkpoint ``checkpoint_id``'s manifest again (checksum and all) with
    ``changes``: what a writer with other numbers, or a hand, would leave."""
    manifest = ck.read_manifest(str(root), checkpoint_id)
    ck.write_manifest(str(root), dataclasses.replace(manifest, **changes))


# ---------------------------------------------------------------- (a) a step that is no step
@pytest.mark.parametrize("step", [-5, 2.5, "9", True], ids=["negative", "float", "text", "bool"])
def test_a_manifest_step_that_is_no_step_is_refused(tmp_path, caplog, step):
    old, _ = _old_and_new(tmp_path)
    _rewrite_manifest(tmp_path, 2, step=step)
    messages = _loads_checkpoint_1(tmp_path, caplog, old)
    _one_line_about(messages, _manifest_path(tmp_path, 2), f"step {step} is not an integer")


# ---------------------------------------------------------------- (b) steps only grow
def test_a_newest_checkpoint_below_an_older_ones_step_is_not_credible(tmp_path, caplog):
    old = _variables(7)
    _write(tmp_path, 1, _snapshots(old, 1, step=400), step=400)
    _write(tmp_path, 2, _snapshots(_variables(8), 1, step=0), step=0)
    messages = _loads_checkpoint_1(tmp_path, caplog, old, step=400)
    _one_line_about(
        messages,
        _manifest_path(tmp_path, 2),
        "its step 0 is below step 400 of the older checkpoint 1",
    )


def test_a_checkpoint_written_after_falling_back_past_an_unreadable_one_stays_credible(
    tmp_path, caplog
):
    """Checkpoint 2 (step 400) does not read, so the job went on from 1 (step 200) and
    wrote 3 at step 250: 2 is no witness against 3, which is loaded."""
    _write(tmp_path, 1, _snapshots(_variables(1), 1, step=200), step=200)
    records = _write(tmp_path, 2, _snapshots(_variables(2), 1, step=400), step=400)
    damaged = os.path.join(ck.checkpoint_dir(str(tmp_path), 2), records[0].name)
    os.truncate(damaged, records[0].size - 1)
    newest = _variables(3)
    _write(tmp_path, 3, _snapshots(newest, 1, step=250), step=250)
    with caplog.at_level(logging.WARNING, logger="ps.shard.checkpoint"):
        loaded = ck.load_newest(str(tmp_path))
    assert loaded is not None and (loaded.checkpoint_id, loaded.step) == (3, 250), caplog.text
    np.testing.assert_array_equal(_full(loaded, 1)["w"], newest["w"])


# ---------------------------------------------------------------- (c) links, owners, modes
def _give_away(path: Path, mode: int | None = None) -> None:
    """``path`` (and what it holds) to nobody, with ``mode`` on ``path`` itself."""
    for where, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(where, name), NOBODY, NOBODY)
    os.lchown(path, NOBODY, NOBODY)
    if mode is not None:
        os.chmod(path, mode)


def _planted(root: Path) -> tuple[str, str]:
    """Checkpoint 2, a well-formed copy of checkpoint 1 holding other weights (7.0):
    the path of its folder and of its shard file."""
    header, tensors = _parsed_file(root, 1)
    planted = [(meta, np.full_like(array, 7.0)) for meta, array in tensors]
    shard = write_crafted(root, 2, {**header, "step": 9}, planted)
    return os.path.dirname(shard), shard


def _folder_linked_to_an_open_folder_of_nobody(root, elsewhere):
    folder, _ = _planted(root)
    target = elsewhere / os.path.basename(folder)
    shutil.move(folder, target)
    _give_away(target, 0o777)
    os.symlink(target, folder)
    return folder, f"{folder} is a symbolic link to {target}, not a real folder"


def _folder_of_nobody(root, elsewhere):
    folder, _ = _planted(root)
    _give_away(Path(folder))
    return folder, f"{folder} is owned by nobody, not by this job's user root"


def _folder_others_can_write(root, elsewhere):
    folder, _ = _planted(root)
    os.chmod(folder, 0o777)
    return folder, f"{folder} is writable by its group and others (mode 777)"


def _shard_file_linked(root, elsewhere):
    _, shard = _planted(root)
    target = elsewhere / "planted.bin"
    shutil.move(shard, target)
    _give_away(target, 0o666)
    os.symlink(target, shard)
    return shard, f"{shard} is a symbolic link to {target}, not a regular file"


def _shard_file_of_nobody(root, elsewhere):
    _, shard = _planted(root)
    _give_away(Path(shard))
    return shard, f"{shard} is owned by nobody"


def _shard_file_others_can_write(root, elsewhere):
    _, shard = _planted(root)
    os.chmod(shard, 0o646)
    return shard, f"{shard} is writable by others (mode 646)"


def _manifest_linked(root, elsewhere):
    folder, _ = _planted(root)
    manifest = os.path.join(folder, ck.MANIFEST)
    target = elsewhere / ck.MANIFEST
    shutil.move(manifest, target)
    os.symlink(target, manifest)
    return manifest, f"{manifest} is a symbolic link to {target}, not a regular file"


PLANTS: list[Callable[[Path, Path], tuple[str, str]]] = [
    _folder_linked_to_an_open_folder_of_nobody,
    _folder_of_nobody,
    _folder_others_can_write,
    _shard_file_linked,
    _shard_file_of_nobody,
    _shard_file_others_can_write,
    _manifest_linked,
]


@pytest.mark.parametrize("plant", PLANTS, ids=[p.__name__.strip("_") for p in PLANTS])
def test_a_planted_folder_or_file_is_refused_for_the_previous_checkpoint(tmp_path, caplog, plant):
    root, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    root.mkdir(mode=0o700)
    elsewhere.mkdir()
    old = _variables(7)
    _write(root, 1, _snapshots(old, 1, step=4), step=4)
    path, reason = plant(root, elsewhere)
    messages = _loads_checkpoint_1(root, caplog, old)
    _one_line_about(messages, path, reason)


# ---------------------------------------------------------------- (d) a FIFO
def _returns_within(seconds: float, fn: Callable[[], object], fifo: str) -> object:
    """``fn()``, run in a thread that must finish within ``seconds``. A thread held in
    an open of ``fifo`` is let go (a writer opens and closes it) before the test fails."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    if not thread.is_alive():
        return result[0]
    deadline = time.monotonic() + 10
    while thread.is_alive() and time.monotonic() < deadline:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader in its open (yet): look again shortly
            thread.join(0.05)
            continue
        os.close(fd)
        thread.join(1.0)
    pytest.fail(f"still running after {seconds}s: held by the FIFO {fifo}")


@pytest.mark.parametrize("which", ["shard file", "manifest"])
def test_a_fifo_in_a_checkpoint_is_refused_at_once(tmp_path, caplog, which):
    old, records = _old_and_new(tmp_path)
    folder = ck.checkpoint_dir(str(tmp_path), 2)
    fifo = os.path.join(folder, records[0].name if which == "shard file" else ck.MANIFEST)
    os.unlink(fifo)
    os.mkfifo(fifo, 0o600)
    started = time.monotonic()
    _returns_within(10.0, lambda: _loads_checkpoint_1(tmp_path, caplog, old), fifo)
    assert time.monotonic() - started < 5.0
    messages = [r.getMessage() for r in caplog.records]
    _one_line_about(messages, fifo, f"{fifo} is a FIFO, not a regular file")


# ---------------------------------------------------------------- (e) sizes before reading
@pytest.mark.parametrize("manifest_agrees", [False, True], ids=["manifest", "header"])
def test_a_sparse_shard_file_of_another_size_is_refused_unread(tmp_path, caplog, manifest_agrees):
    """A 1 GiB sparse shard file: the manifest's size, or (when the manifest was made to
    agree) the file's own header, refuses it before its bytes are read."""
    old, records = _old_and_new(tmp_path)
    shard = os.path.join(ck.checkpoint_dir(str(tmp_path), 2), records[0].name)
    os.truncate(shard, GiB)
    if manifest_agrees:
        _rewrite_manifest(tmp_path, 2, files=(dataclasses.replace(records[0], size=GiB),))
    before = _bytes_read()
    messages = _loads_checkpoint_1(tmp_path, caplog, old)
    assert _bytes_read() - before < 16 << 20  # the two small checkpoints, not the GiB
    says = "its header says" if manifest_agrees else "the manifest says"
    _one_line_about(messages, shard, f"{shard}: {GiB} bytes, {says} {records[0].size}")


def test_a_checkpoint_larger_than_the_memory_is_refused_unread(tmp_path, caplog, monkeypatch):
    """The sane bound: a checkpoint whose files hold more than this machine's memory is
    refused from its manifest (here a memory made smaller than checkpoint 2)."""
    old = _variables(7)
    small = _write(tmp_path, 1, _snapshots(old, 1, step=4), step=4)
    big = _write(tmp_path, 2, _snapshots({"w": np.zeros((4000, 4))}, 1, step=9), step=9)
    monkeypatch.setattr(ck, "physical_memory", lambda: small[0].size * 2)
    before = _bytes_read()
    messages = _loads_checkpoint_1(tmp_path, caplog, old)
    assert _bytes_read() - before < big[0].size
    folder = ck.checkpoint_dir(str(tmp_path), 2)
    _one_line_about(messages, folder, f"its files hold {big[0].size} bytes, more than")


def test_files_written_under_an_open_umask_are_still_private(tmp_path):
    """What the shards write must pass the readers' checks whatever the umask."""
    previous = os.umask(0o002)
    try:
        _old_and_new(tmp_path)
    finally:
        os.umask(previous)
    loaded = ck.load_newest(str(tmp_path))
    assert loaded is not None and loaded.checkpoint_id == 2


def test_open_private_file_rules(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f").write_bytes(b"x" * 10)
    with open_private_file(str(root / "sub" / "f"), str(root), 100, size=10) as f:
        assert bytes(f.read(10)) == b"x" * 10
        with pytest.raises(PrivateFileError, match="ends after 10 bytes"):
            f.read(1)
    with pytest.raises(PrivateFileError, match="more than the 9 it may hold"):
        open_private_file(str(root / "sub" / "f"), str(root), 9)
    with pytest.raises(PrivateFileError, match="is not inside"):
        open_private_file(str(root / "sub" / ".." / ".." / "x"), str(root), 9)
    with pytest.raises(PrivateFileError, match="is a folder, not a regular file"):
        open_private_file(str(root / "sub"), str(root), 9)
    with pytest.raises(PrivateFileError, match="cannot read it: No such file"):
        open_private_file(str(root / "sub" / "missing"), str(root), 9)
    private_dir.check_private_folder(str(root / "sub"), str(root))


# ---------------------------------------------------------------- a real shard, all at once
@pytest.mark.timeout(120)
def test_a_shard_starts_promptly_from_the_newest_credible_checkpoint_and_says_why(
    embedded_server, tmp_path
):
    ckpt = tmp_path / "ckpt"
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
    with PSJob(embedded_server, tmp_path / "first", 1, checkpoint_dir=str(ckpt)).start() as job:
        client = job.client()
        client.init({"w": np.zeros((10, 4))}, optimizer="adam", lr=0.1)
        for _ in range(3):
            client.push({"w": np.ones((10, 4))})
        job.wait_checkpoint(min_step=3)
        expected = client.pull()["w"]
    good = ck.load_newest(str(ckpt))
    assert good is not None and good.step == 3
    g = good.checkpoint_id
    header, tensors = _parsed_file(ckpt, g)
    planted = [(meta, np.full_like(array, 7.0)) for meta, array in tensors]
    said: dict[str, str] = {}  # a path -> what the shard's one line about it says
    # g+1: a manifest step of -5
    write_crafted(ckpt, g + 1, header, planted)
    _rewrite_manifest(ckpt, g + 1, step=-5)
    said[_manifest_path(ckpt, g + 1)] = "step -5 is not an integer of at least 0"
    # g+2: a 1 GiB sparse shard file
    shard = write_crafted(ckpt, g + 2, header, planted)
    os.truncate(shard, GiB)
    said[shard] = f"{GiB} bytes, the manifest says"
    # g+3: the folder, a link to a folder of nobody's that anyone may write
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = os.path.dirname(write_crafted(elsewhere, g + 3, header, planted))
    _give_away(Path(folder), 0o777)
    os.symlink(folder, ck.checkpoint_dir(str(ckpt), g + 3))
    said[ck.checkpoint_dir(str(ckpt), g + 3)] = "is a symbolic link to"
    # g+4: a FIFO for the shard file
    fifo = write_crafted(ckpt, g + 4, header, planted)
    os.unlink(fifo)
    os.mkfifo(fifo, 0o600)
    said[fifo] = "is a FIFO, not a regular file"
    # g+5, the newest: well formed, at step 0
    write_crafted(ckpt, g + 5, {**header, "step": 0}, planted)
    said[_manifest_path(ckpt, g + 5)] = f"its step 0 is below step 3 of the older checkpoint {g}"

    started = time.monotonic()
    second = PSJob(embedded_server, tmp_path / "second", 1, checkpoint_dir=str(ckpt))
    with second.start(timeout=30) as job:
        took = time.monotonic() - started
        assert job.shard_status(0)["step"] == 3
        np.testing.assert_array_equal(job.client().pull()["w"], expected)
        log = job.shard_log(0)
    assert took < 20, f"the shard took {took:.1f}s to start"
    lines = log.splitlines()
    for path, reason in said.items():
        about = [line for line in lines if path in line and "skipping checkpoint" in line]
        assert len(about) == 1 and reason in about[0], (path, log)
    assert f"loaded checkpoint {g} (step 3)" in log and "Traceback" not in log
