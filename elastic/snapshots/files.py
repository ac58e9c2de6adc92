"""The files of one snapshot on disk (no networking, no decisions about when).

A snapshot of commit ``step`` is a folder ``snap-<step>-<token>`` under its root (the
checkpoint directory, or ``host-<label>`` in it when each host keeps its own copy; the
token tells this attempt from a torn one of an earlier run at the same step):

* ``part-<k>-of-<n>.bin``: part ``k``, the raw bytes of its pieces of the state's arrays
  (``elastic.snapshots.parts``), written by one worker;
* ``skeleton.pkl``: the state without its large arrays (``elastic.snapshots.codec``);
* ``MANIFEST.json``, written last: every file with its size and SHA-256, the arrays'
  kinds, shapes and sizes. A snapshot is complete when its manifest is there.

Every file is written whole or not at all (a temporary name, fsync, rename; the folder
fsynced after the manifest), so a crash mid-write leaves the previous snapshot whole and
the new one incomplete (ignored, and removed once a newer one is complete). A reader
checks every checksum and size before it builds anything from the bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from elastic.errors import SnapshotError
from elastic.snapshots.codec import Leaf
from elastic.snapshots.parts import Piece
from elastic.snapshots.uncached import UncachedFile

FORMAT = 1
PREFIX = "snap-"
MANIFEST = "MANIFEST.json"
SKELETON = "skeleton.pkl"
HOST_PREFIX = "host-"
UNUSABLE_PREFIX = "unusable-"  # a snapshot found corrupt, renamed so that none reads it again
_READ = 4 * 1024 * 1024  # bytes read at a time while checking a file


@dataclass(frozen=True)
class FileEntry:
    """One file of a snapshot: its name in the folder, its size and SHA-256."""

    file: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class LeafEntry:
    """One array of the state: its codec's kind, what the codec needs, its size."""

    kind: str
    meta: dict
    nbytes: int


@dataclass(frozen=True)
class Manifest:
    """What a complete snapshot holds (see the module docstring)."""

    step: int
    round_id: int
    job_id: str
    written: float
    chunk: int
    skeleton: FileEntry
    leaves: tuple[LeafEntry, ...]
    parts: tuple[FileEntry, ...]
    format: int = FORMAT

    @property
    def nbytes(self) -> int:
        return self.skeleton.bytes + sum(p.bytes for p in self.parts)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Raises ``ValueError``/``TypeError``/``KeyError`` on anything malformed."""
        raw = json.loads(data)
        if raw.get("format") != FORMAT:
            raise ValueError(f"unknown snapshot format {raw.get('format')!r}")
        manifest = cls(
            step=int(raw["step"]),
            round_id=int(raw["round_id"]),
            job_id=str(raw["job_id"]),
            written=float(raw["written"]),
            chunk=int(raw["chunk"]),
            skeleton=FileEntry(**raw["skeleton"]),
            leaves=tuple(LeafEntry(**leaf) for leaf in raw["leaves"]),
            parts=tuple(FileEntry(**part) for part in raw["parts"]),
        )
        for entry in (manifest.skeleton, *manifest.parts):
            if os.path.basename(entry.file) != entry.file or entry.file in ("", ".", ".."):
                raise ValueError(
                    f"a manifest entry names a file outside its folder: {entry.file!r}"
                )
        return manifest


def folder(root: str, step: int, token: str) -> str:
    """The folder of attempt ``token`` at a snapshot of commit ``step`` under ``root``."""
    return os.path.join(root, f"{PREFIX}{step:012d}-{token}")


def part_name(index: int, parts: int) -> str:
    return f"part-{index:05d}-of-{parts:05d}.bin"


def _durable(path: str, write, uncached: bool = False) -> FileEntry:
    """Write a file whole or not at all: ``write(f, digest)`` fills a temporary file
    (around the page cache when ``uncached``: ``UncachedFile``), which is fsynced and
    renamed to ``path``. Returns its entry.

    Raises:
        OSError: the file cannot be written (a full disk among others); nothing is
            left behind.
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    digest = hashlib.sha256()
    try:
        with UncachedFile(tmp) if uncached else open(tmp, "wb") as f:
            write(f, digest)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return FileEntry(os.path.basename(path), size, digest.hexdigest())


def write_part(
    directory: str, index: int, parts: int, pieces: Sequence[Piece], leaves: Sequence[Leaf]
) -> FileEntry:
    """Write part ``index`` of ``parts``: the bytes of ``pieces`` of ``leaves``, in order.

    Raises:
        OSError: the part cannot be written (nothing of it is left behind).
    """
    os.makedirs(directory, exist_ok=True)

    def write(f, digest) -> None:
        for piece in pieces:
            data = leaves[piece.leaf].data.read(piece.start, piece.stop)
            digest.update(data)
            f.write(data)

    # Around the page cache: the bytes are read only after a failure, and caching them
    # costs the training processes CPU and memory (see ``uncached``).
    return _durable(os.path.join(directory, part_name(index, parts)), write, uncached=True)


def write_skeleton(directory: str, skeleton: bytes) -> FileEntry:
    """Raises ``OSError`` when it cannot be written."""
    os.makedirs(directory, exist_ok=True)

    def write(f, digest) -> None:
        digest.update(skeleton)
        f.write(skeleton)

    return _durable(os.path.join(directory, SKELETON), write)


def write_manifest(directory: str, manifest: Manifest) -> None:
    """The last file of a snapshot: from now on it is complete. Raises ``OSError``."""
    data = manifest.to_json()

    def write(f, digest) -> None:
        f.write(data)

    _durable(os.path.join(directory, MANIFEST), write)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(directory: str) -> Manifest | None:
    """The manifest of the snapshot in ``directory``; None when it is missing or does
    not parse (an incomplete or foreign folder)."""
    try:
        with open(os.path.join(directory, MANIFEST), "rb") as f:
            return Manifest.from_json(f.read())
    except (OSError, ValueError, TypeError, KeyError):
        return None


def roots(directory: str) -> list[str]:
    """Every root under the checkpoint directory that may hold snapshots: itself, and
    each host's own folder in it."""
    found = [directory]
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if name.startswith(HOST_PREFIX) and os.path.isdir(path):
                found.append(path)
    return found


def complete(root: str) -> list[tuple[Manifest, str]]:
    """The complete snapshots under ``root``, newest first, with their folders. (Of any
    job: a checkpoint directory belongs to one training, whichever job ids its runs had,
    so that the same command started again resumes it.)"""
    found: list[tuple[Manifest, str]] = []
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if not name.startswith(PREFIX) or ".tmp" in name:
                continue
            path = os.path.join(root, name)
            manifest = read_manifest(path)
            if manifest is not None:
                found.append((manifest, path))
    found.sort(key=lambda item: (item[0].step, item[0].written), reverse=True)
    return found


def _read_checked(directory: str, entry: FileEntry, into: Sequence[memoryview]) -> None:
    """Read ``entry``'s file into the views ``into`` (their sizes add up to the file's),
    checking its size and SHA-256.

    Raises:
        SnapshotError: the file is missing, of another size, or its checksum differs.
    """
    path = os.path.join(directory, entry.file)
    digest = hashlib.sha256()
    try:
        if os.path.getsize(path) != entry.bytes or sum(v.nbytes for v in into) != entry.bytes:
            raise SnapshotError(
                f"{path}: {os.path.getsize(path)} bytes, the manifest says {entry.bytes}"
            )
        with open(path, "rb") as f:
            for view in into:
                done = 0
                while done < view.nbytes:
                    got = f.readinto(view[done : done + _READ])
                    if not got:
                        raise SnapshotError(f"{path}: shorter than its manifest says")
                    digest.update(view[done : done + got])
                    done += got
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    if digest.hexdigest() != entry.sha256:
        raise SnapshotError(f"{path}: checksum mismatch (a torn or corrupt file)")


def read(directory: str, manifest: Manifest, cut) -> tuple[bytes, list[bytearray]]:
    """The skeleton and the leaves' bytes of the snapshot in ``directory``, every file
    checked against ``manifest``; ``cut(leaf_sizes, parts, chunk)`` gives the pieces of
    each part (``elastic.snapshots.parts.cut``).

    Raises:
        SnapshotError: a file is missing, torn or corrupt (the message names it).
    """
    skeleton = bytearray(manifest.skeleton.bytes)
    _read_checked(directory, manifest.skeleton, [memoryview(skeleton)])
    buffers = [bytearray(leaf.nbytes) for leaf in manifest.leaves]
    views = [memoryview(b) for b in buffers]
    pieces = cut([leaf.nbytes for leaf in manifest.leaves], len(manifest.parts), manifest.chunk)
    for entry, part in zip(manifest.parts, pieces):
        _read_checked(directory, entry, [views[p.leaf][p.start : p.stop] for p in part])
    return bytes(skeleton), buffers


def prune(root: str, keep: int, written: int) -> None:
    """Keep the ``keep`` newest complete snapshots under ``root``; delete older ones, and
    incomplete folders of commits before ``written`` (the snapshot just completed): never
    a folder a snapshot may still be writing, nor one of a newer commit."""
    snapshots = complete(root)
    for _, path in snapshots[keep:]:
        shutil.rmtree(path, ignore_errors=True)
    kept = {path for _, path in snapshots[:keep]}
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if not name.startswith(PREFIX) or path in kept:
                continue
            step = _step_of(name)
            if step is not None and step < written and read_manifest(path) is None:
                shutil.rmtree(path, ignore_errors=True)


def set_aside(directory: str) -> str | None:
    """Rename a snapshot found corrupt so that no reader takes it again (kept, for a
    person to look at); its new path, or None when it cannot be renamed."""
    parent, name = os.path.split(directory)
    target = os.path.join(parent, UNUSABLE_PREFIX + name)
    try:
        os.rename(directory, target)
    except OSError:
        return None
    return target


def remove(directory: str) -> None:
    """Delete an abandoned snapshot's folder (best effort)."""
    shutil.rmtree(directory, ignore_errors=True)


def _step_of(name: str) -> int | None:
    try:
        return int(name[len(PREFIX) :].split("-", 1)[0])
    except ValueError:
        return None


def now() -> float:
    """The wall-clock time a manifest records (``written``)."""
    return time.time()
