"""Checkpoint files on a real disk: atomic writes, checksums, manifests, fallback to the
previous complete checkpoint, pruning, and re-cutting for another shard count."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from elastic.ps.errors import PSCheckpointError
from elastic.ps.optimizers import make_optimizer
from elastic.ps.partition import place
from elastic.ps.shard import checkpoint as ck

THRESHOLD = 64


def _variables(seed: int):
    rng = np.random.default_rng(seed)
    return {
        "w": rng.normal(size=(10, 4)).astype(np.float32),
        "b": rng.normal(size=3),
        "scale": np.array(2.5),
    }


def _snapshots(full: dict, num_shards: int, step: int, optimizer="adam"):
    """What each shard would hold: slices of params and of (made-up) slots."""
    opt = make_optimizer(optimizer, 0.1)
    snaps = [ck.ShardSnapshot(step, {}, {"client": step}) for _ in range(num_shards)]
    for name, value in full.items():
        slots = opt.slots(value)
        for k in slots:
            if k == "t":
                slots[k][...] = step
            else:
                slots[k] = value * (2 if k == "m" else 3)
        for sl in place(name, value.shape, value.dtype, num_shards, THRESHOLD):
            snaps[sl.shard].variables[name] = ck.SavedVariable(
                sl,
                sl.take(value),
                {k: (a if k == "t" else sl.take(a)) for k, a in slots.items()},
                opt.config(),
            )
    return snaps


def _write(root, checkpoint_id, snaps, step):
    records = [
        ck.write_shard(str(root), checkpoint_id, i, len(snaps), s) for i, s in enumerate(snaps)
    ]
    ck.write_manifest(
        str(root), ck.Manifest(checkpoint_id, step, len(snaps), THRESHOLD, tuple(records), 1.0)
    )
    return records


def _newest(root) -> ck.LoadedCheckpoint:
    """The newest complete checkpoint under ``root`` (the test expects one)."""
    loaded = ck.load_newest(str(root))
    assert loaded is not None, f"no complete checkpoint in {root}"
    return loaded


def _full(loaded, num_shards):
    out: dict[str, np.ndarray] = {}
    for i in range(num_shards):
        for name, v in loaded.shard_snapshot(i, num_shards, THRESHOLD).variables.items():
            arr = out.setdefault(name, np.empty(v.slice.full_shape, np.dtype(v.slice.dtype)))
            v.slice.take(arr)[...] = v.param
            assert set(v.slots) == {"m", "v", "t"}
            np.testing.assert_array_equal(v.slots["m"], v.param * 2)
            assert int(v.slots["t"]) == loaded.step
    return out


def test_write_and_load_round_trip(tmp_path):
    full = _variables(0)
    _write(tmp_path, 1, _snapshots(full, 2, step=5), step=5)
    loaded = _newest(tmp_path)
    assert (loaded.checkpoint_id, loaded.step) == (1, 5)
    got = _full(loaded, 2)
    for name in full:
        np.testing.assert_array_equal(got[name], full[name])
    snap0 = loaded.shard_snapshot(0, 2, THRESHOLD)
    assert snap0.dedup == {"client": 5} and snap0.step == 5
    assert not [n for n in os.listdir(ck.checkpoint_dir(str(tmp_path), 1)) if n.endswith(".tmp")]


@pytest.mark.parametrize("new_n", [1, 3, 4])
def test_restore_into_a_different_shard_count(tmp_path, new_n):
    full = _variables(1)
    _write(tmp_path, 1, _snapshots(full, 2, step=9), step=9)
    loaded = _newest(tmp_path)
    got = _full(loaded, new_n)
    for name in full:
        np.testing.assert_array_equal(got[name], full[name])
    assert loaded.shard_snapshot(0, new_n, THRESHOLD).dedup == {}  # clients are new after a re-cut


def _damage(path, how):
    if how == "truncate":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    elif how == "flip":
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xFF]))
    else:
        os.unlink(path)


@pytest.mark.parametrize("how", ["truncate", "flip", "delete"])
def test_damaged_shard_file_falls_back_to_previous_checkpoint_with_a_warning(tmp_path, caplog, how):
    old, new = _variables(2), _variables(3)
    _write(tmp_path, 1, _snapshots(old, 2, step=10), step=10)
    records = _write(tmp_path, 2, _snapshots(new, 2, step=20), step=20)
    bad = os.path.join(ck.checkpoint_dir(str(tmp_path), 2), records[1].name)
    _damage(bad, how)
    with caplog.at_level(logging.WARNING, logger="elastic.ps.shard.checkpoint"):
        loaded = _newest(tmp_path)
    assert (loaded.checkpoint_id, loaded.step) == (1, 10)
    assert bad in caplog.text
    np.testing.assert_array_equal(_full(loaded, 2)["w"], old["w"])
    with pytest.raises(PSCheckpointError, match=records[1].name):
        ck.read_checkpoint(str(tmp_path), 2)


def test_corrupt_manifest_and_missing_manifest(tmp_path, caplog):
    _write(tmp_path, 1, _snapshots(_variables(4), 1, step=1), step=1)
    _write(tmp_path, 2, _snapshots(_variables(5), 1, step=2), step=2)
    snaps = _snapshots(_variables(6), 1, step=3)
    ck.write_shard(str(tmp_path), 3, 0, 1, snaps[0])  # no manifest: incomplete, ignored silently
    manifest = os.path.join(ck.checkpoint_dir(str(tmp_path), 2), ck.MANIFEST)
    with open(manifest, "r+b") as f:
        text = f.read().replace(b'"step": 2', b'"step": 7')
        f.seek(0)
        f.write(text)
    with caplog.at_level(logging.WARNING, logger="elastic.ps.shard.checkpoint"):
        loaded = _newest(tmp_path)
    assert loaded.checkpoint_id == 1
    assert manifest in caplog.text and "checkpoint 3" not in caplog.text
    assert ck.next_checkpoint_id(str(tmp_path)) == 4


def test_no_checkpoint(tmp_path):
    assert ck.load_newest(str(tmp_path)) is None
    assert ck.load_newest(str(tmp_path / "missing")) is None
    assert ck.load_newest(None) is None
    assert ck.next_checkpoint_id(str(tmp_path)) == 1


def test_prune_keeps_newest_complete_and_newer_in_progress(tmp_path):
    for i in range(1, 6):
        _write(tmp_path, i, _snapshots(_variables(i), 1, step=i), step=i)
    ck.write_shard(str(tmp_path), 6, 0, 1, _snapshots(_variables(6), 1, step=6)[0])
    ck.prune(str(tmp_path), keep=2)
    assert ck.checkpoint_ids(str(tmp_path)) == [4, 5, 6]
    assert _newest(tmp_path).checkpoint_id == 5


def test_write_atomic_leaves_old_file_when_interrupted(tmp_path):
    path = str(tmp_path / "f.bin")
    ck.write_atomic(path, [b"old"])

    def parts():
        yield b"new"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ck.write_atomic(path, parts())
    with open(path, "rb") as f:
        assert f.read() == b"old"
    assert os.listdir(tmp_path) == ["f.bin"]
