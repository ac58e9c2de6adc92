"""Checkpoint files on disk (no networking; the protocol that decides *when* lives in
``coordinator.py``; the records and names the files are made of, and the manifest's own
reading, in ``checkpoint_format.py``).

Layout under the checkpoint dir::

    ckpt-0000000007/shard-0000-of-0002.bin    one file per shard
    ckpt-0000000007/shard-0001-of-0002.bin
    ckpt-0000000007/MANIFEST.json             written last: the checkpoint is complete

Every file is written atomically: a temp file in the same directory, fsync, rename,
fsync of the directory. A shard file is ``MAGIC`` + a ``wire`` message (JSON header +
raw arrays) + the SHA-256 of everything before it (hashed while writing: one pass);
the manifest records each shard file's size and that SHA-256, and carries a SHA-256
of its own body. A directory without a valid manifest is incomplete and never loaded.

A write the disk refuses raises ``PSCheckpointWriteError`` naming the file
(``PSNoSpaceError`` for a full disk or quota). ``make_room`` deletes the oldest
checkpoints, never the newest complete one, while the disk has less free space than the
next checkpoint will take (about what the newest complete one takes).

``load_newest`` walks checkpoints newest first and takes the first that is credible and
whose manifest and *every* file verify (checksums, then contents: ``checkpoint_check``),
logging a warning that names each checkpoint it had to skip and why. The manifest lists
exactly the shard files of its shard count, so no name in it reaches outside the
checkpoint directory. All shards therefore choose the same checkpoint. Each file stores
its slices' metadata (variable name, full shape, rows held), so
``LoadedCheckpoint.shard_snapshot`` can cut the variables for any shard count.

Nothing in the directory is trusted for being there. Every file is opened through
``rendezvous.private_dir.open_private_file`` (no symbolic link, a regular file opened
without blocking, this user's and not writable by others, its size checked on the
open descriptor before it is read). A manifest's numbers must be what a writer writes
(a step of -5 is no step). A shard file's size must be what the manifest says and what
its own header says (checked after the header, before the arrays are read), and a
checkpoint may not hold more than this machine's memory. A checkpoint is credible when
no older complete checkpoint that reads holds a higher step: steps only grow, so a
newer checkpoint below an older one was not written by this job in order (see
docs/DESIGN.md), and the newest credible one is used instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile

import numpy as np

from ps import wire
from ps.errors import (
    PSCheckpointError,
    PSCheckpointWriteError,
    PSError,
    PSNoSpaceError,
)
from ps.partition import Slice, assemble, slice_for
from ps.shard.checkpoint_check import check_checkpoint
from ps.shard.checkpoint_format import (  # the records and names the files are made of
    DIGEST_BYTES,
    DIR_RE,
    FORMAT,
    MAGIC,
    MANIFEST,
    FileRecord,
    Manifest,
    SavedVariable,
    ShardSnapshot,
    checkpoint_dir,
    shard_filename,
)
from rendezvous import disk_room
from rendezvous.private_dir import (
    PrivateFile,
    PrivateFileError,
    open_private_file,
    physical_memory,
)

log = logging.getLogger("ps.shard.checkpoint")

# The next checkpoint is taken to need this much more than the newest complete one:
# variables created since, and a manifest that grows with them.
GROWTH = 1.05
# A manifest is about 120 bytes a shard: this is room for 100,000 shards, and what a
# manifest file larger than it holds is never read.
MANIFEST_LIMIT = 16 << 20
_FRAME = struct.Struct("!I")  # a shard file's header length, after MAGIC (wire framing)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, parts, trailer: bool = False) -> tuple[int, str]:
    """Write the concatenation of ``parts`` to ``path`` atomically (temp file in the same
    directory, fsync, rename, fsync of the directory); returns (size, SHA-256 hex of the
    parts). With ``trailer`` the raw digest is appended to the file (not hashed)."""
    directory = os.path.dirname(path) or "."
    digest, size = hashlib.sha256(), 0
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
                digest.update(part)
                size += memoryview(part).nbytes
            if trailer:
                f.write(digest.digest())
                size += DIGEST_BYTES
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    return size, digest.hexdigest()


def _write_failed(path: str, exc: OSError) -> PSCheckpointWriteError:
    """The typed error of a write of ``path`` that the system refused with ``exc``."""
    cls = PSNoSpaceError if disk_room.is_no_space(exc) else PSCheckpointWriteError
    return cls(f"cannot write {path}: {exc.strerror or exc}")


def write_shard(
    root: str, checkpoint_id: int, index: int, num_shards: int, snapshot: ShardSnapshot
) -> FileRecord:
    """Write one shard's file of checkpoint ``checkpoint_id``; returns its record for the
    manifest.

    Raises:
        PSNoSpaceError: the disk or the quota is full.
        PSCheckpointWriteError: the disk refused otherwise."""
    directory = checkpoint_dir(root, checkpoint_id)
    header = {
        "format": FORMAT,
        "checkpoint_id": checkpoint_id,
        "step": snapshot.step,
        "shard": index,
        "num_shards": num_shards,
        "dedup": snapshot.dedup,
        "variables": {
            name: {"slice": v.slice.to_dict(), "optimizer": v.optimizer}
            for name, v in snapshot.variables.items()
        },
    }
    tensors = []
    for name, v in snapshot.variables.items():
        tensors.append(({"var": name, "slot": None}, v.param))
        tensors.extend(({"var": name, "slot": s}, a) for s, a in v.slots.items())
    name = shard_filename(index, num_shards)
    path = os.path.join(directory, name)
    try:
        # Into the folder the coordinator made (``make_checkpoint_dir``), never one of its
        # own: a write that comes after the coordinator gave the attempt up and removed
        # its folder (a call it stopped waiting for) fails here instead of leaving one.
        size, sha = write_atomic(path, [MAGIC, *wire.encode_parts(header, tensors)], trailer=True)
    except OSError as exc:
        raise _write_failed(path, exc) from None
    return FileRecord(name, size, sha)


def make_checkpoint_dir(root: str, checkpoint_id: int) -> None:
    """The folder of checkpoint ``checkpoint_id``, made by the coordinator before the
    shards write their files into it; private whatever the umask (a reader refuses a
    folder others may write).

    Raises:
        PSNoSpaceError: the disk or the quota is full.
        PSCheckpointWriteError: the disk refused otherwise."""
    directory = checkpoint_dir(root, checkpoint_id)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise _write_failed(directory, exc) from None


def write_manifest(root: str, manifest: Manifest) -> str:
    """Write the manifest last: from then on the checkpoint is complete. Returns its path.

    Raises:
        PSNoSpaceError: the disk or the quota is full.
        PSCheckpointWriteError: the disk refused otherwise."""
    path = os.path.join(checkpoint_dir(root, manifest.checkpoint_id), MANIFEST)
    try:
        write_atomic(path, [manifest.to_bytes()])
    except OSError as exc:
        raise _write_failed(path, exc) from None
    return path


def checkpoint_ids(root: str) -> list[int]:
    """Ids of every checkpoint directory (complete or not), ascending."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(DIR_RE.match, names) if m)


def next_checkpoint_id(root: str) -> int:
    ids = checkpoint_ids(root)
    return (ids[-1] + 1) if ids else 1


def _read_shard_file(root: str, path: str, record: FileRecord) -> tuple[dict, list]:
    """Verify and parse one shard file of the checkpoint directory ``root``.

    Raises:
        PSCheckpointError: naming ``path``: a link, not a regular file, not this
            user's own, not the size the manifest or its header says, a checksum
            mismatch or malformed contents."""
    try:
        with open_private_file(path, root, physical_memory(), size=record.size) as f:
            return _parse_shard_file(f, record)
    except PrivateFileError as exc:
        raise PSCheckpointError(str(exc)) from None


def _parse_shard_file(f: PrivateFile, record: FileRecord) -> tuple[dict, list]:
    """The (header, tensors) of the shard file ``f``, whose size is the manifest's.
    Its header is read first: the file must be exactly as long as the header says
    before its arrays are allocated and read.

    Raises:
        PSCheckpointError: naming the file.
        PrivateFileError: a read fails or the file ends early."""
    path = f.path
    lead = len(MAGIC) + _FRAME.size
    if f.size < lead + DIGEST_BYTES:
        raise PSCheckpointError(f"{path}: {f.size} bytes, too short for a ps checkpoint file")
    digest = hashlib.sha256()
    prefix = f.read(lead, digest)
    if bytes(prefix[: len(MAGIC)]) != MAGIC:
        raise PSCheckpointError(f"{path}: not a ps checkpoint file")
    (head_len,) = _FRAME.unpack_from(prefix, len(MAGIC))
    if lead + head_len + DIGEST_BYTES > f.size:
        raise PSCheckpointError(
            f"{path}: a header of {head_len} bytes in a file of {f.size} (corrupted)"
        )
    head = f.read(head_len, digest)
    try:
        header = json.loads(head)
        if not isinstance(header, dict):
            raise ValueError("the header is not an object")
        body = sum(wire.tensor_bytes(meta) for meta in wire.tensor_metas(header))
    except (ValueError, TypeError, RecursionError, PSError) as exc:
        raise PSCheckpointError(f"{path}: corrupted or malformed header: {exc}") from None
    expected = lead + head_len + body + DIGEST_BYTES
    if expected != f.size:
        raise PSCheckpointError(
            f"{path}: {f.size} bytes, its header says {expected} (corrupted or malformed)"
        )
    data = bytearray(body)
    f.readinto(memoryview(data), digest)
    trailer = bytes(f.read(DIGEST_BYTES))
    if digest.hexdigest() != record.sha256 or digest.digest() != trailer:
        raise PSCheckpointError(f"{path}: checksum mismatch (corrupted)")
    try:
        return header, wire.tensors_of(header, data)
    except Exception as exc:  # noqa: BLE001 - a well-checksummed but malformed file: a writer bug
        raise PSCheckpointError(f"{path}: malformed contents: {exc}") from None


class LoadedCheckpoint:
    """A verified complete checkpoint: its manifest and every shard file's contents."""

    def __init__(self, root: str, manifest: Manifest, files: dict[str, tuple[dict, list]]):
        self.root = root
        self.manifest = manifest
        self._files = files

    @property
    def checkpoint_id(self) -> int:
        return self.manifest.checkpoint_id

    @property
    def step(self) -> int:
        return self.manifest.step

    def shard_snapshot(self, index: int, num_shards: int, threshold: int) -> ShardSnapshot:
        """The state shard ``index`` of ``num_shards`` holds, re-cut with the
        partitioner when the shard count (or threshold) differs from the writer's."""
        same_layout = (
            num_shards == self.manifest.num_shards and threshold == self.manifest.split_threshold
        )
        dedup: dict[str, int] = {}
        if same_layout:
            own = self._files.get(shard_filename(index, num_shards))
            dedup = dict(own[0].get("dedup", {})) if own else {}
        meta: dict[str, dict] = {}
        by_var: dict[str, list[tuple[Slice, str | None, np.ndarray]]] = {}
        for header, tensors in self._files.values():
            meta.update(header["variables"])
            for tmeta, array in tensors:
                src = Slice.from_dict(header["variables"][tmeta["var"]]["slice"])
                by_var.setdefault(tmeta["var"], []).append((src, tmeta["slot"], array))
        variables = {}
        for name, info in meta.items():
            full = Slice.from_dict(info["slice"])
            target = slice_for(name, full.full_shape, full.dtype, index, num_shards, threshold)
            if target is None:
                continue
            sources = by_var.get(name, [])
            param = assemble(target, [(s, a) for s, slot, a in sources if slot is None])
            slot_names = sorted({slot for _, slot, _ in sources if slot is not None})
            slots = {
                sn: assemble(target, [(s, a) for s, slot, a in sources if slot == sn])
                for sn in slot_names
            }
            variables[name] = SavedVariable(target, param, slots, dict(info["optimizer"]))
        return ShardSnapshot(self.manifest.step, variables, dedup)


def read_manifest(root: str, checkpoint_id: int) -> Manifest:
    """The verified manifest of checkpoint ``checkpoint_id`` (its files are not read).

    Raises:
        PSCheckpointError: naming the manifest (or the folder that holds it) when it is
            missing, not to be trusted (``open_private_file``) or does not verify."""
    path = os.path.join(checkpoint_dir(root, checkpoint_id), MANIFEST)
    try:
        with open_private_file(path, root, MANIFEST_LIMIT) as f:
            data = bytes(f.read(f.size))
    except PrivateFileError as exc:
        raise PSCheckpointError(str(exc)) from None
    manifest = Manifest.from_bytes(data, path)
    if manifest.checkpoint_id != checkpoint_id:
        raise PSCheckpointError(f"{path}: manifest of checkpoint {manifest.checkpoint_id}")
    return manifest


def read_checkpoint(root: str, checkpoint_id: int) -> LoadedCheckpoint:
    """Verify, read and check (``checkpoint_check``) checkpoint ``checkpoint_id``.

    Raises:
        PSCheckpointError: naming the first missing, untrusted, truncated, corrupted
            or malformed file, or a checkpoint larger than this machine's memory."""
    directory = checkpoint_dir(root, checkpoint_id)
    manifest = read_manifest(root, checkpoint_id)
    # Every shard file is held at once: more than the memory cannot be loaded at all.
    total, memory = sum(r.size for r in manifest.files), physical_memory()
    if total > memory:
        raise PSCheckpointError(
            f"{directory}: its files hold {total} bytes, more than this machine's memory ({memory})"
        )
    files = {
        r.name: _read_shard_file(root, os.path.join(directory, r.name), r) for r in manifest.files
    }
    check_checkpoint(
        directory,
        checkpoint_id,
        manifest.num_shards,
        {i: (r.name, files[r.name]) for i, r in enumerate(manifest.files)},
    )
    return LoadedCheckpoint(root, manifest, files)


def is_complete(root: str, checkpoint_id: int) -> bool:
    return os.path.exists(os.path.join(checkpoint_dir(root, checkpoint_id), MANIFEST))


def load_newest(root: str | None) -> LoadedCheckpoint | None:
    """The newest credible checkpoint whose manifest and every file verify, or None.
    Each checkpoint skipped is logged as one warning naming why (the file at fault, or
    the older checkpoint whose higher step makes it not credible)."""
    if not root:
        return None
    ids = [i for i in reversed(checkpoint_ids(root)) if is_complete(root, i)]
    manifests: dict[int, Manifest | PSCheckpointError] = {}
    for checkpoint_id in ids:
        try:
            manifests[checkpoint_id] = read_manifest(root, checkpoint_id)
        except PSCheckpointError as exc:
            manifests[checkpoint_id] = exc  # said when (if) the walk reaches it
    failed: set[int] = set()
    kept: list[LoadedCheckpoint] = []  # the last one read, at most: one checkpoint in memory

    def attempt(checkpoint_id: int) -> LoadedCheckpoint | None:
        """Checkpoint ``checkpoint_id`` read whole, or None (said once)."""
        if checkpoint_id in failed:
            return None
        if kept and kept[0].checkpoint_id == checkpoint_id:
            return kept[0]
        kept.clear()  # never two checkpoints in memory at once: one may take most of it
        try:
            loaded = read_checkpoint(root, checkpoint_id)
        except PSCheckpointError as exc:
            failed.add(checkpoint_id)
            log.warning("skipping checkpoint %d, using an older one: %s", checkpoint_id, exc)
            return None
        kept[:] = [loaded]
        return loaded

    for checkpoint_id in ids:
        manifest = manifests[checkpoint_id]
        if isinstance(manifest, PSCheckpointError):
            log.warning("skipping checkpoint %d, using an older one: %s", checkpoint_id, manifest)
            continue
        # Steps only grow: an older checkpoint at a higher step that reads (a witness;
        # one that does not read proves nothing, and a job that fell back past it goes
        # on from a lower step) makes this one not credible.
        higher = [
            (older, m.step)
            for older, m in manifests.items()
            if older < checkpoint_id and isinstance(m, Manifest) and m.step > manifest.step
        ]
        witness = next(((older, step) for older, step in higher if attempt(older)), None)
        if witness is not None:
            log.warning(
                "skipping checkpoint %d, using an older one: its step %d is below step %d "
                "of the older checkpoint %d, and a job's steps only grow (%s)",
                checkpoint_id,
                manifest.step,
                witness[1],
                witness[0],
                os.path.join(checkpoint_dir(root, checkpoint_id), MANIFEST),
            )
            continue
        loaded = attempt(checkpoint_id)
        if loaded is not None:
            return loaded
    return None


def remove_checkpoint(root: str, checkpoint_id: int) -> None:
    """Delete checkpoint ``checkpoint_id``'s directory and what it holds (best effort:
    what cannot be deleted stays, and is deleted by a later prune)."""
    shutil.rmtree(checkpoint_dir(root, checkpoint_id), ignore_errors=True)


def prune(root: str, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints and anything newer (in progress);
    delete every older directory, complete or not."""
    complete = [i for i in checkpoint_ids(root) if is_complete(root, i)]
    if len(complete) <= keep:
        return
    oldest_kept = complete[-keep]
    for checkpoint_id in checkpoint_ids(root):
        if checkpoint_id < oldest_kept:
            remove_checkpoint(root, checkpoint_id)


def _bytes_on_disk(root: str, checkpoint_id: int) -> int:
    """What complete checkpoint ``checkpoint_id`` takes on its filesystem: its files and
    manifest, each rounded up to whole blocks. Raises OSError, PSCheckpointError."""
    block = max(os.statvfs(root).f_frsize, 1)
    directory = checkpoint_dir(root, checkpoint_id)
    sizes = [r.size for r in read_manifest(root, checkpoint_id).files]
    sizes.append(os.path.getsize(os.path.join(directory, MANIFEST)))
    return sum(-(-size // block) * block for size in sizes)


def make_room(root: str) -> list[int]:
    """When the filesystem of ``root`` has less free space than the next checkpoint
    will take (about what the newest complete one takes, ``GROWTH`` more), delete the
    oldest checkpoint directories until it has: first the incomplete ones (abandoned:
    never loaded), then complete ones, oldest first, never the newest complete one.
    Returns the ids deleted. Best effort: a directory or a filesystem that cannot be
    measured is left as it is (the write then says what is wrong)."""
    ids = checkpoint_ids(root)
    complete = [i for i in ids if is_complete(root, i)]
    if not complete:
        return []
    victims = [i for i in ids if i not in complete] + complete[:-1]
    try:
        needed = GROWTH * _bytes_on_disk(root, complete[-1])
    except (OSError, PSCheckpointError) as exc:
        log.warning("cannot make room for a checkpoint in %s: %s", root, exc)
        return []
    return disk_room.make_room(root, victims, needed, lambda i: remove_checkpoint(root, i))
