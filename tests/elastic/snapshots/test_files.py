"""The files of a snapshot on disk: written whole or not at all, complete only with
its manifest, read back checked, pruned to the newest few."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from elastic.errors import SnapshotError
from elastic.snapshots import codec, files, keeping
from elastic.snapshots.parts import cut
from elastic.snapshots.structure import describe
from rendezvous import disk_room

JOB = "j"


def write_snapshot(
    root, step: int, values: dict, writers: int = 2, token: str = "t", job: str = JOB
) -> str:
    """Write ``values`` as a snapshot of ``step`` by ``writers`` writers, as the writer
    threads do (each its part; part 0 the skeleton and the manifest), tagged with the
    job ``job`` and the values' structure."""
    folder = files.folder(str(root), step, token, job)
    skeleton, leaves = codec.split(values)
    plan = cut([leaf.nbytes for leaf in leaves], writers, chunk=1 << 16)
    entries = [files.write_part(folder, k, writers, plan[k], leaves) for k in range(writers)]
    manifest = files.Manifest(
        step=step,
        round_id=1,
        job_id=job,
        written=files.now(),
        chunk=1 << 16,
        skeleton=files.write_skeleton(folder, skeleton),
        leaves=tuple(files.LeafEntry(leaf.kind, leaf.meta, leaf.nbytes) for leaf in leaves),
        parts=tuple(entries),
        structure=describe(values),
    )
    files.write_manifest(folder, manifest)
    return folder


def load(folder: str) -> dict:
    manifest = files.read_manifest(folder)
    assert manifest is not None
    skeleton, buffers = files.read(folder, manifest, lambda s, p, c: cut(s, p, c))
    kinds = [leaf.kind for leaf in manifest.leaves]
    return codec.join(skeleton, kinds, [leaf.meta for leaf in manifest.leaves], buffers)


def values(n: int) -> dict:
    return {"w": np.arange(n, dtype=np.float64), "epoch": n}


def test_a_snapshot_written_in_parts_reads_back_whole(tmp_path):
    folder = write_snapshot(tmp_path, 7, values(50_000), writers=3)
    back = load(folder)
    assert np.array_equal(back["w"], values(50_000)["w"]) and back["epoch"] == 50_000
    assert [m.step for m, _ in files.complete(str(tmp_path))] == [7]


def test_only_a_folder_with_its_manifest_is_complete(tmp_path):
    write_snapshot(tmp_path, 7, values(20_000))
    folder = files.folder(str(tmp_path), 9, "x", JOB)
    _, leaves = codec.split(values(20_000))
    files.write_part(folder, 0, 1, cut([leaf.nbytes for leaf in leaves], 1)[0], leaves)
    assert [m.step for m, _ in files.complete(str(tmp_path))] == [7]
    assert not [n for n in os.listdir(folder) if ".tmp" in n]  # no temporary file left


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
def test_a_torn_or_corrupt_file_is_found_before_anything_is_built(tmp_path, damage):
    folder = write_snapshot(tmp_path, 7, values(30_000))
    part = os.path.join(folder, files.part_name(1, 2))
    if damage == "flip":
        with open(part, "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif damage == "truncate":
        os.truncate(part, 10)
    else:
        os.unlink(part)
    with pytest.raises(SnapshotError, match=files.part_name(1, 2)):
        load(folder)


def test_a_manifest_naming_a_file_outside_its_folder_is_no_snapshot(tmp_path):
    folder = write_snapshot(tmp_path, 7, values(20_000))
    path = os.path.join(folder, files.MANIFEST)
    with open(path) as f:
        raw = json.load(f)
    raw["parts"][0]["file"] = "../../etc/passwd"
    with open(path, "w") as f:
        json.dump(raw, f)
    assert files.read_manifest(folder) is None and files.complete(str(tmp_path)) == []


def test_pruning_keeps_the_newest_and_drops_older_torn_folders(tmp_path):
    for step in (3, 5, 8, 13):
        write_snapshot(tmp_path, step, values(10), token=f"t{step}")
    torn_old = files.folder(str(tmp_path), 4, "torn", JOB)
    torn_new = files.folder(str(tmp_path), 20, "writing", JOB)
    os.makedirs(torn_old)
    os.makedirs(torn_new)
    files.prune(str(tmp_path), 2, 13, JOB, describe(values(10)))
    assert [m.step for m, _ in files.complete(str(tmp_path))] == [13, 8]
    assert not os.path.exists(torn_old)  # older than the one just written: debris
    assert os.path.exists(torn_new)  # newer: a snapshot may still be writing it


def test_a_stale_newer_snapshot_does_not_make_pruning_drop_one_being_written(tmp_path):
    """A snapshot of a higher commit left by an earlier timeline (one the job fell back
    from) must not make a prune take a folder the current timeline is still writing."""
    write_snapshot(tmp_path, 900, values(10), token="stale")
    write_snapshot(tmp_path, 40, values(10), token="now")
    writing = files.folder(str(tmp_path), 45, "final", JOB)
    os.makedirs(writing)
    files.prune(str(tmp_path), 3, 40, JOB, describe(values(10)))
    assert os.path.exists(writing)


def test_a_corrupt_snapshot_set_aside_is_no_longer_found(tmp_path):
    write_snapshot(tmp_path, 5, values(10), token="a")
    write_snapshot(tmp_path, 8, values(10), token="b")
    (_, newest), _ = files.complete(str(tmp_path))
    moved = files.set_aside(newest)
    assert moved is not None and os.path.isdir(moved)
    assert [m.step for m, _ in files.complete(str(tmp_path))] == [5]


def test_the_roots_are_the_directory_and_each_hosts_own_folder(tmp_path):
    (tmp_path / "host-a").mkdir()
    (tmp_path / "other").mkdir()
    assert files.roots(str(tmp_path)) == [str(tmp_path), str(tmp_path / "host-a")]


def test_a_snapshot_is_tagged_with_its_job_and_the_structure_of_its_state(tmp_path):
    folder = write_snapshot(tmp_path, 7, values(20_000), job="job-a")
    manifest = files.read_manifest(folder)
    assert manifest is not None and manifest.job_id == "job-a"
    assert manifest.structure == describe(values(20_000))
    assert os.path.basename(folder).endswith(keeping.job_tag("job-a"))  # a torn one says it too


def test_pruning_leaves_another_jobs_and_another_states_snapshots_alone(tmp_path):
    for step in (3, 5, 8):
        write_snapshot(tmp_path, step, values(10), token=f"a{step}")
    theirs = write_snapshot(tmp_path, 1, values(10), token="b", job="other")
    torn_theirs = files.folder(str(tmp_path), 2, "torn", "other")
    os.makedirs(torn_theirs)
    changed = write_snapshot(tmp_path, 2, {"w": np.zeros(3), "epoch": 0}, token="old-model")
    files.prune(str(tmp_path), 1, 8, JOB, describe(values(10)))
    left = sorted(m.step for m, _ in files.complete(str(tmp_path)))
    assert left == [1, 2, 8], left  # another job's and another state's kept; ours pruned to 1
    assert os.path.isdir(theirs) and os.path.isdir(torn_theirs) and os.path.isdir(changed)


def test_a_legacy_manifest_reads_untagged(tmp_path):
    """A snapshot of the version before the tags (format 1, no structure) is read, its
    structure unknown (``keeping.LEGACY``)."""
    folder = write_snapshot(tmp_path, 7, values(20_000))
    path = os.path.join(folder, files.MANIFEST)
    with open(path) as f:
        raw = json.load(f)
    raw["format"] = files.LEGACY_FORMAT
    del raw["structure"]
    with open(path, "w") as f:
        json.dump(raw, f)
    manifest = files.read_manifest(folder)
    assert manifest is not None and manifest.structure is None
    assert np.array_equal(load(folder)["w"], values(20_000)["w"])


def test_a_full_disk_makes_room_from_the_oldest_never_the_newest(tmp_path, monkeypatch):
    """``make_room`` deletes this job's oldest first, and stops once there is room."""
    for step in (3, 5, 8):
        write_snapshot(tmp_path, step, values(10), token=f"a{step}")
    theirs = write_snapshot(tmp_path, 1, values(10), token="b", job="other")
    deleted: list[str] = []
    monkeypatch.setattr(disk_room, "free_bytes", lambda _path: 100 if len(deleted) >= 1 else 0)
    real_remove = files.remove

    def remove(path: str) -> None:
        deleted.append(path)
        real_remove(path)

    monkeypatch.setattr(files, "remove", remove)
    gone = files.make_room(str(tmp_path), 13, 100, JOB, describe(values(10)))
    assert gone == deleted and len(gone) == 1 and "000000000003" in gone[0]
    assert sorted(m.step for m, _ in files.complete(str(tmp_path))) == [1, 5, 8]
    assert os.path.isdir(theirs)
