"""Checkpoint files on a real disk: atomic writes, checksums, manifests, fallback to the
previous complete checkpoint, pruning, room made on a full disk (a real small tmpfs),
and re-cutting for another shard count."""

from __future__ import annotations

import copy
import logging
import os

import numpy as np
import pytest

from ps import wire
from ps.errors import PSCheckpointError, PSCheckpointWriteError, PSNoSpaceError
from ps.optimizers import make_optimizer
from ps.partition import place
from ps.shard import checkpoint as ck
from tests.support.tmpfs import fill, small_tmpfs

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
    ck.make_checkpoint_dir(str(root), checkpoint_id)  # the coordinator's part
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
    with caplog.at_level(logging.WARNING, logger="ps.shard.checkpoint"):
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
    ck.make_checkpoint_dir(str(tmp_path), 3)
    ck.write_shard(str(tmp_path), 3, 0, 1, snaps[0])  # no manifest: incomplete, ignored silently
    manifest = os.path.join(ck.checkpoint_dir(str(tmp_path), 2), ck.MANIFEST)
    with open(manifest, "r+b") as f:
        text = f.read().replace(b'"step": 2', b'"step": 7')
        f.seek(0)
        f.write(text)
    with caplog.at_level(logging.WARNING, logger="ps.shard.checkpoint"):
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
    ck.make_checkpoint_dir(str(tmp_path), 6)
    ck.write_shard(str(tmp_path), 6, 0, 1, _snapshots(_variables(6), 1, step=6)[0])
    ck.prune(str(tmp_path), keep=2)
    assert ck.checkpoint_ids(str(tmp_path)) == [4, 5, 6]
    assert _newest(tmp_path).checkpoint_id == 5


def test_a_shard_file_is_written_only_into_the_folder_the_coordinator_made(tmp_path):
    """A shard's write that comes after the coordinator gave its attempt up (and removed
    the folder) fails, leaving no folder behind."""
    snap = _snapshots(_variables(2), 1, step=1)[0]
    with pytest.raises(PSCheckpointWriteError, match="ckpt-0000000001"):
        ck.write_shard(str(tmp_path), 1, 0, 1, snap)
    assert os.listdir(tmp_path) == []


def test_a_full_disk_makes_room_oldest_first_and_refuses_a_file_with_a_typed_error(tmp_path):
    """A 2 MiB tmpfs and checkpoints of 600 kB (three fit, a fourth does not):
    ``make_room`` deletes an abandoned attempt, then the oldest complete ones, until
    about one more checkpoint fits, and never the newest complete one; a file the full
    disk refuses is ``PSNoSpaceError`` naming it, and leaves no partial file."""
    with small_tmpfs(tmp_path / "ckpt") as root:

        def write(checkpoint_id: int):
            snaps = _snapshots({"w": np.zeros(75_000)}, 1, checkpoint_id, optimizer="sgd")
            _write(root, checkpoint_id, snaps, checkpoint_id)

        for checkpoint_id in (1, 2, 3):
            write(checkpoint_id)
        abandoned = ck.checkpoint_dir(str(root), 4)
        os.makedirs(abandoned)
        (root / os.path.basename(abandoned) / "junk").write_bytes(b"x")
        assert ck.make_room(str(root)) == [4, 1]
        write(5)
        fill(root, 16 << 10, "ballast-1")
        assert ck.make_room(str(root)) == [2, 3]
        write(6)
        fill(root, 16 << 10, "ballast-2")
        assert ck.make_room(str(root)) == [5]
        fill(root, 16 << 10, "ballast-3")
        assert ck.make_room(str(root)) == []  # only the newest complete one is left
        snap = _snapshots({"w": np.zeros(75_000)}, 1, 7, optimizer="sgd")[0]
        ck.make_checkpoint_dir(str(root), 7)
        with pytest.raises(PSNoSpaceError, match=r"ckpt-0000000007/shard-0000-of-0001\.bin: No sp"):
            ck.write_shard(str(root), 7, 0, 1, snap)
        assert os.listdir(ck.checkpoint_dir(str(root), 7)) == []
        assert ck.checkpoint_ids(str(root)) == [6, 7] and _newest(root).checkpoint_id == 6


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


# ------------------------------------------------------------------ well checksummed, malformed
def _parsed_file(root, checkpoint_id: int, index: int = 0, num_shards: int = 1):
    """The (header, tensors) of a shard file written by ``_write``, to be altered."""
    directory = ck.checkpoint_dir(str(root), checkpoint_id)
    with open(os.path.join(directory, ck.MANIFEST), "rb") as f:
        manifest = ck.Manifest.from_bytes(f.read(), "manifest")
    record = manifest.files[index]
    header, tensors = ck._read_shard_file(str(root), os.path.join(directory, record.name), record)
    return copy.deepcopy(header), [(dict(meta), np.array(a)) for meta, a in tensors]


def write_crafted(root, checkpoint_id: int, header: dict, tensors, name: str | None = None):
    """A one-shard checkpoint whose file holds ``header`` and ``tensors`` under ``name``
    (default: the shard file's own name), with correct checksums and manifest."""
    directory = ck.checkpoint_dir(str(root), checkpoint_id)
    os.makedirs(directory, exist_ok=True)
    name = name or ck.shard_filename(0, 1)
    if isinstance(header.get("checkpoint_id"), int):
        header = {**header, "checkpoint_id": checkpoint_id}
    size, sha = ck.write_atomic(
        os.path.join(directory, name), [ck.MAGIC, *wire.encode_parts(header, tensors)], trailer=True
    )
    record = ck.FileRecord(name, size, sha)
    step = header["step"] if isinstance(header.get("step"), int) else 0
    ck.write_manifest(str(root), ck.Manifest(checkpoint_id, step, 1, THRESHOLD, (record,), 1.0))
    return os.path.join(directory, name)


def _drop_variables(header, tensors):
    del header["variables"]
    return header, tensors


def _huge_rows(header, tensors):
    header["variables"]["w"]["slice"].update(stop=2**40, full_shape=[2**40, 4])
    return header, tensors


def _rows_not_covered(header, tensors):
    header["variables"]["w"]["slice"].update(stop=5)
    return header, [(m, a[:5] if m["var"] == "w" and a.ndim else a) for m, a in tensors]


def _slot_missing(header, tensors):
    return header, [(m, a) for m, a in tensors if not (m["var"] == "w" and m["slot"] == "m")]


def _unknown_optimizer(header, tensors):
    header["variables"]["b"]["optimizer"] = {"optimizer": "nope"}
    return header, tensors


def _parameter_of_another_dtype(header, tensors):
    return header, [
        (m, a.astype(np.float64) if m["var"] == "w" and m["slot"] is None else a)
        for m, a in tensors
    ]


def _variables_not_a_table(header, tensors):
    header["variables"] = []
    return header, tensors


def _tensor_of_no_variable(header, tensors):
    return header, [*tensors, ({"var": "ghost", "slot": None}, np.zeros(2))]


def _wrong_shard(header, tensors):
    header["shard"] = 3
    return header, tensors


MALFORMED = {  # how a file is altered -> what the warning says
    _drop_variables: "no variables table",
    _huge_rows: "variable 'w': parameter",
    _rows_not_covered: "rows up to 5 of 10",
    _slot_missing: "its optimizer has ['m', 't', 'v']",
    _unknown_optimizer: "unknown optimizer 'nope'",
    _parameter_of_another_dtype: "parameter float64",
    _variables_not_a_table: "no variables table",
    _tensor_of_no_variable: "has no variable",
    _wrong_shard: "shard is 3",
}


@pytest.mark.parametrize("alter", MALFORMED, ids=[f.__name__.strip("_") for f in MALFORMED])
def test_well_checksummed_malformed_file_falls_back_to_the_previous_checkpoint(
    tmp_path, caplog, alter
):
    old = _variables(7)
    _write(tmp_path, 1, _snapshots(old, 1, step=4), step=4)
    _write(tmp_path, 2, _snapshots(_variables(8), 1, step=9), step=9)
    bad = write_crafted(tmp_path, 3, *alter(*_parsed_file(tmp_path, 2)))
    with caplog.at_level(logging.WARNING, logger="ps.shard.checkpoint"):
        loaded = _newest(tmp_path)
    assert loaded.checkpoint_id == 2, caplog.text
    assert f"{bad}: malformed contents" in caplog.text and MALFORMED[alter] in caplog.text
    with pytest.raises(PSCheckpointError, match="malformed contents"):
        ck.read_checkpoint(str(tmp_path), 3)


def test_a_faithful_copy_of_a_file_passes_the_checks(tmp_path):
    """The crafting helper itself writes what the shards write."""
    full = _variables(9)
    _write(tmp_path, 1, _snapshots(full, 1, step=3), step=3)
    write_crafted(tmp_path, 2, *_parsed_file(tmp_path, 1))
    loaded = ck.read_checkpoint(str(tmp_path), 2)
    np.testing.assert_array_equal(_full(loaded, 1)["w"], full["w"])


@pytest.mark.parametrize("name", ["../planted.bin", "ABSOLUTE", "shard-0000-of-0001.bin/../../x"])
def test_manifest_names_outside_the_checkpoint_are_refused(tmp_path, caplog, name):
    """A manifest that names a well-formed, checksummed file outside its directory (a
    relative path up, or an absolute path) is refused like a corrupt one."""
    _write(tmp_path, 1, _snapshots(_variables(10), 1, step=5), step=5)
    header, tensors = _parsed_file(tmp_path, 1)
    planted = tmp_path / "planted"
    planted.mkdir()
    if name == "ABSOLUTE":
        name = str(planted / "planted.bin")
    elif not name.startswith(".."):  # the path goes through a directory of that name
        os.makedirs(os.path.join(ck.checkpoint_dir(str(planted), 2), name.split("/")[0]))
    # the planted checkpoint: its manifest names a file of another directory
    path = write_crafted(planted, 2, header, tensors, name)
    assert not os.path.realpath(path).startswith(ck.checkpoint_dir(str(planted), 2))
    _write(planted, 1, _snapshots(_variables(11), 1, step=5), step=5)
    with caplog.at_level(logging.WARNING, logger="ps.shard.checkpoint"):
        loaded = _newest(planted)
    assert loaded.checkpoint_id == 1
    assert "not the shard files" in caplog.text
