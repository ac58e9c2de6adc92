"""The files of one snapshot on disk (no networking, no decisions about when).

A snapshot of commit ``step`` is a folder ``snap-<step>-<token>-j<job>`` under its root
(the checkpoint directory, or ``host-<label>`` in it when each host keeps its own copy;
the token tells this attempt from a torn one of an earlier run at the same step, and
``<job>`` is a digest of the job's id, so that even a torn folder says whose it is):

* ``part-<k>-of-<n>.bin``: part ``k``, the raw bytes of its pieces of the state's arrays
  (``elastic.snapshots.parts``), written by one worker;
* ``skeleton.pkl``: the state without its large arrays (``elastic.snapshots.codec``);
* ``MANIFEST.json``, written last: every file with its size and SHA-256, the arrays'
  kinds, shapes and sizes, and its tags: the job's id and the structure of the state
  (``elastic.snapshots.structure``). A snapshot is complete when its manifest is there.
  One of an older version (format 1) has no structure: it is "legacy"
  (``elastic.snapshots.keeping``).

Every file is written whole or not at all (a temporary name, fsync, rename; the folder
fsynced after the manifest), so a crash mid-write leaves the previous snapshot whole and
the new one incomplete (ignored, and removed once a newer one is complete). A reader
checks every checksum and size before it builds anything from the bytes.

Nothing under the checkpoint directory is trusted for being there (the skeleton is a
pickle: loading a planted one runs its code). Folders and files are written readable
by their owner only, and read only through ``rendezvous.private_dir``: a host's folder,
a snapshot's folder and each file must be real (no symbolic link), this user's and not
writable by others, a file regular (opened without blocking: a FIFO never holds the
reader) and of the size its manifest says, checked on the open descriptor before it is
read, and no larger than this machine's memory in all. A manifest's numbers must be
what a writer writes (no negative step). A folder refused so is said once, in one line
naming it and why, and never read.

Which snapshots this job may load, prune, or delete to make room on a full disk is
``elastic.snapshots.keeping``'s decision (pure); this module lists and deletes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from elastic.errors import SnapshotError
from elastic.snapshots import keeping
from elastic.snapshots.codec import Leaf
from elastic.snapshots.parts import Piece
from elastic.snapshots.structure import Structure
from elastic.snapshots.uncached import UncachedFile
from rendezvous import disk_room
from rendezvous.private_dir import (
    PrivateFile,
    PrivateFileError,
    check_private_folder,
    open_private_file,
    physical_memory,
)

log = logging.getLogger(__name__)

FORMAT = 2
LEGACY_FORMAT = 1  # before the tags: no structure (read, said "legacy": ``keeping``)
PREFIX = "snap-"
MANIFEST = "MANIFEST.json"
SKELETON = "skeleton.pkl"
HOST_PREFIX = "host-"
UNUSABLE_PREFIX = "unusable-"  # a snapshot found corrupt, renamed so that none reads it again
MANIFEST_LIMIT = 64 << 20  # a manifest is ~100 bytes an array and a part: never larger
_said: set[str] = set()  # refused folders already said (a sync looks at them every round)


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
    structure: Structure | None = None  # None: a legacy snapshot (format 1)
    format: int = FORMAT

    @property
    def nbytes(self) -> int:
        return self.skeleton.bytes + sum(p.bytes for p in self.parts)

    def to_json(self) -> bytes:
        raw = asdict(self)
        raw["structure"] = self.structure.to_json() if self.structure is not None else None
        return json.dumps(raw, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Raises ``ValueError``/``TypeError``/``KeyError`` on anything malformed."""
        raw = json.loads(data)
        if raw.get("format") not in (FORMAT, LEGACY_FORMAT):
            raise ValueError(f"unknown snapshot format {raw.get('format')!r}")
        tagged = raw["format"] == FORMAT
        manifest = cls(
            step=_count(raw, "step", 0),
            round_id=_count(raw, "round_id", 0),
            job_id=str(raw["job_id"]),
            written=float(raw["written"]),
            chunk=_count(raw, "chunk", 1),
            skeleton=FileEntry(**raw["skeleton"]),
            leaves=tuple(LeafEntry(**leaf) for leaf in raw["leaves"]),
            parts=tuple(FileEntry(**part) for part in raw["parts"]),
            structure=Structure.from_json(raw["structure"]) if tagged else None,
            format=raw["format"],
        )
        for entry in (manifest.skeleton, *manifest.parts):
            if os.path.basename(entry.file) != entry.file or entry.file in ("", ".", ".."):
                raise ValueError(
                    f"a manifest entry names a file outside its folder: {entry.file!r}"
                )
            _count(asdict(entry), "bytes", 0)
        for leaf in manifest.leaves:
            _count(asdict(leaf), "nbytes", 0)
        # The parts hold the arrays' bytes and nothing else: a reader allocates the
        # arrays from the manifest, so sizes that disagree are refused before that.
        leaves, parts = sum(x.nbytes for x in manifest.leaves), sum(p.bytes for p in manifest.parts)
        if leaves != parts:
            raise ValueError(f"its arrays hold {leaves} bytes and its parts {parts}")
        return manifest


def _count(raw: dict, key: str, least: int) -> int:
    """``raw[key]``, an integer of at least ``least`` as a writer writes it (not a float
    cut short, a string or a boolean).

    Raises:
        ValueError: naming the field and its value.
        KeyError: the field is missing."""
    value = raw[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{key} {str(value)[:40]} is not an integer of at least {least}")
    return value


def _make_folder(directory: str) -> None:
    """``directory`` and its parent (a host's folder), readable by their owner only
    whatever the umask: a reader refuses a folder others may write. Raises OSError."""
    os.makedirs(os.path.dirname(directory), mode=0o700, exist_ok=True)
    os.makedirs(directory, mode=0o700, exist_ok=True)


def folder(root: str, step: int, token: str, job_id: str) -> str:
    """The folder of job ``job_id``'s attempt ``token`` at a snapshot of commit ``step``
    under ``root``."""
    return os.path.join(root, f"{PREFIX}{step:012d}-{token}-{keeping.job_tag(job_id)}")


def part_name(index: int, parts: int) -> str:
    return f"part-{index:05d}-of-{parts:05d}.bin"


def _private(path: str, flags: int) -> int:
    """``open``'s opener of a new file readable by its owner only."""
    return os.open(path, flags, 0o600)


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
        with UncachedFile(tmp, 0o600) if uncached else open(tmp, "wb", opener=_private) as f:
            # A leftover temporary file keeps its mode through O_TRUNC: set it.
            os.fchmod(f.fileno(), 0o600)
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
    _make_folder(directory)

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
    _make_folder(directory)

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
    """The manifest of the snapshot in ``directory``; None when it is missing (an
    incomplete folder), or when it or its folder is not to be trusted or does not parse
    (said once: ``_refuse``)."""
    path = os.path.join(directory, MANIFEST)
    base = os.path.dirname(directory)  # a root: the checkpoint directory or a host's folder
    try:
        with open_private_file(path, base, MANIFEST_LIMIT) as f:
            return Manifest.from_json(bytes(f.read(f.size)))
    except PrivateFileError as exc:
        torn = not os.path.islink(directory) and not os.path.lexists(path)
        if not torn:  # a manifest not written yet is no news; anything else is said
            _refuse(directory, str(exc))
        return None
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        _refuse(directory, f"{path}: not a snapshot manifest: {exc}")
        return None


def _refuse(directory: str, why: str) -> None:
    """Say once per process that the snapshot folder ``directory`` is not used."""
    if directory not in _said:
        _said.add(directory)
        log.warning("snapshot folder %s is not used: %s", directory, why)


def roots(directory: str) -> list[str]:
    """Every root under the checkpoint directory that may hold snapshots: itself, and
    each host's own folder in it that is a real folder of this user (others are said
    once, and skipped)."""
    found = [directory]
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if name.startswith(HOST_PREFIX) and os.path.isdir(path):
                try:
                    check_private_folder(path, directory)
                except PrivateFileError as exc:
                    _refuse(path, str(exc))
                    continue
                found.append(path)
    return found


def complete(root: str) -> list[tuple[Manifest, str]]:
    """The complete snapshots under ``root``, newest first, with their folders, of every
    job (whose is ``keeping``'s to say)."""
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


def _open_checked(directory: str, entry: FileEntry) -> PrivateFile:
    """``entry``'s file, open, of the size the manifest says (``open_private_file``).

    Raises:
        SnapshotError: it is missing, not to be trusted, or of another size."""
    path = os.path.join(directory, entry.file)
    try:
        return open_private_file(path, os.path.dirname(directory), entry.bytes, entry.bytes)
    except PrivateFileError as exc:
        raise SnapshotError(str(exc)) from None


def _read_checked(file: PrivateFile, entry: FileEntry, into: Sequence[memoryview]) -> None:
    """Read ``entry``'s open file into the views ``into`` (their sizes add up to the
    file's, ``open_private_file`` checked it against the manifest), checking its SHA-256.

    Raises:
        SnapshotError: the file is shorter, unreadable, or its checksum differs.
    """
    if sum(v.nbytes for v in into) != entry.bytes:
        raise SnapshotError(f"{file.path}: its pieces do not add up to {entry.bytes} bytes")
    digest = hashlib.sha256()
    try:
        for view in into:
            file.readinto(view, digest)
    except PrivateFileError as exc:
        raise SnapshotError(str(exc)) from None
    if digest.hexdigest() != entry.sha256:
        raise SnapshotError(f"{file.path}: checksum mismatch (a torn or corrupt file)")


def read(directory: str, manifest: Manifest, cut) -> tuple[bytes, list[bytearray]]:
    """The skeleton and the leaves' bytes of the snapshot in ``directory``, every file
    checked against ``manifest``; ``cut(leaf_sizes, parts, chunk)`` gives the pieces of
    each part (``elastic.snapshots.parts.cut``). Every file is opened and its size
    checked before a buffer is allocated.

    Raises:
        SnapshotError: a file is missing, not to be trusted, torn or corrupt, or the
            snapshot is larger than this machine's memory (the message names it).
    """
    total, memory = manifest.nbytes, physical_memory()
    if total > memory:
        raise SnapshotError(
            f"{directory}: its files hold {total} bytes, more than this machine's memory ({memory})"
        )
    opened: list[PrivateFile] = []
    try:
        for entry in (manifest.skeleton, *manifest.parts):
            opened.append(_open_checked(directory, entry))
        skeleton = bytearray(manifest.skeleton.bytes)
        _read_checked(opened[0], manifest.skeleton, [memoryview(skeleton)])
        buffers = [bytearray(leaf.nbytes) for leaf in manifest.leaves]
        views = [memoryview(b) for b in buffers]
        sizes = [leaf.nbytes for leaf in manifest.leaves]
        pieces = cut(sizes, len(manifest.parts), manifest.chunk)
        for file, entry, part in zip(opened[1:], manifest.parts, pieces):
            _read_checked(file, entry, [views[p.leaf][p.start : p.stop] for p in part])
    finally:
        for file in opened:
            file.close()
    return bytes(skeleton), buffers


def torn(root: str) -> list[tuple[int, str]]:
    """The snapshot folders under ``root`` with no manifest (a torn attempt, or one still
    being written), each with its commit. One whose manifest is there but refused is not
    among them: it is kept, for a person to look at."""
    found: list[tuple[int, str]] = []
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            path = os.path.join(root, name)
            step = _step_of(name) if name.startswith(PREFIX) else None
            if step is not None and not os.path.lexists(os.path.join(path, MANIFEST)):
                found.append((step, path))
    return found


def _found(root: str, job_id: str, structure: Structure) -> keeping.Found:
    """What is under ``root``, as ``keeping`` decides on it: whose each complete and
    each torn snapshot is, for job ``job_id`` whose state is of ``structure``."""
    return keeping.Found(
        complete=tuple(
            keeping.Snapshot(
                path,
                manifest.step,
                manifest.written,
                keeping.whose(manifest.job_id, manifest.structure, job_id, structure),
            )
            for manifest, path in complete(root)
        ),
        torn=tuple(
            keeping.Snapshot(path, step, 0.0, keeping.whose_folder(path, job_id))
            for step, path in torn(root)
        ),
    )


def prune(root: str, keep: int, written: int, job_id: str, structure: Structure) -> None:
    """Keep the ``keep`` newest complete snapshots of job ``job_id``'s state (of
    ``structure``) under ``root``, delete older ones of it, and torn folders of its own
    of commits before ``written`` (the snapshot just completed): never a folder a
    snapshot may still be writing, nor another job's or another state's
    (``keeping.to_prune``)."""
    for path in keeping.to_prune(_found(root, job_id, structure), keep, written):
        remove(path)


def make_room(root: str, step: int, needed: int, job_id: str, structure: Structure) -> list[str]:
    """On a full disk: delete job ``job_id``'s oldest snapshots under ``root`` (torn
    folders first, never the newest complete one, nor another job's or another state's:
    ``keeping.room``) until the file system has ``needed`` bytes free for the snapshot
    of commit ``step``; the folders deleted."""
    victims = keeping.room(_found(root, job_id, structure), step)
    return disk_room.make_room(root, victims, needed, remove)


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
    """Delete a snapshot's folder (best effort): its manifest first, so that a process
    that ends halfway (a worker's exit as it prunes) leaves a torn folder, never a
    "complete" one missing files."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(directory, MANIFEST))
    shutil.rmtree(directory, ignore_errors=True)


def _step_of(name: str) -> int | None:
    try:
        return int(name[len(PREFIX) :].split("-", 1)[0])
    except ValueError:
        return None


def now() -> float:
    """The wall-clock time a manifest records (``written``)."""
    return time.time()
