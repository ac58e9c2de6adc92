"""What a ps checkpoint is made of (``ps.shard.checkpoint`` writes and reads the files):
the folder and file names (``checkpoint_dir``, ``shard_filename``, ``DIR_RE``), the
shard file's ``MAGIC`` and digest, what a shard saves (``ShardSnapshot`` of
``SavedVariable``), and the manifest (``Manifest`` of ``FileRecord``) with its checksum
and its checks: every number as a writer writes it, and exactly the shard files of its
shard count, so no name in it reaches outside the checkpoint's folder.

Why apart from the files' I/O: a shard's state, its journal and its server speak these
records without touching a disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field

import numpy as np

from ps.errors import PSCheckpointError
from ps.partition import Slice

MAGIC = b"EPSCKPT1"
DIGEST_BYTES = hashlib.sha256().digest_size
MANIFEST = "MANIFEST.json"
FORMAT = 1
DIR_RE = re.compile(r"^ckpt-(\d{10})$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class SavedVariable:
    """One variable slice with its optimizer config and slots (as held by a shard)."""

    slice: Slice
    param: np.ndarray
    slots: dict[str, np.ndarray]
    optimizer: dict


@dataclass
class ShardSnapshot:
    """What one shard saves and restores: its step, its slices and its push de-duplication
    table (client id -> last applied push sequence number)."""

    step: int
    variables: dict[str, SavedVariable] = field(default_factory=dict)
    dedup: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FileRecord:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    checkpoint_id: int
    step: int
    num_shards: int
    split_threshold: int
    files: tuple[FileRecord, ...]
    created: float = 0.0

    def to_bytes(self) -> bytes:
        body = {
            "format": FORMAT,
            "checkpoint_id": self.checkpoint_id,
            "step": self.step,
            "num_shards": self.num_shards,
            "split_threshold": self.split_threshold,
            "created": self.created,
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in self.files],
        }
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        body["checksum"] = hashlib.sha256(canonical.encode()).hexdigest()
        return json.dumps(body, sort_keys=True, indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        """Raises PSCheckpointError (naming ``where``) for bad JSON or a checksum mismatch."""
        try:
            body = json.loads(data)
            checksum = body.pop("checksum")
            canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
            if hashlib.sha256(canonical.encode()).hexdigest() != checksum:
                raise PSCheckpointError(f"{where}: manifest checksum mismatch")
            if body.get("format") != FORMAT:
                raise PSCheckpointError(f"{where}: unknown manifest format {body.get('format')!r}")
            files = tuple(
                FileRecord(f["name"], _count(f, "size", 0, where), _sha(f["sha256"], where))
                for f in body["files"]
            )
            manifest = cls(
                _count(body, "checkpoint_id", 0, where),
                _count(body, "step", 0, where),
                _count(body, "num_shards", 1, where),
                _count(body, "split_threshold", 1, where),
                files,
                float(body.get("created", 0.0)),
            )
        except PSCheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PSCheckpointError(f"{where}: unreadable manifest: {exc}") from None
        # Exactly the shard files of this shard count: a name with a path in it ("../x",
        # "/etc/x") would be read from outside the checkpoint directory.
        names = [f.name for f in manifest.files]
        expected = [shard_filename(i, manifest.num_shards) for i in range(manifest.num_shards)]
        if manifest.num_shards < 1 or names != expected:
            raise PSCheckpointError(
                f"{where}: the manifest lists files {str(names)[:120]}, not the shard files "
                f"of {manifest.num_shards} shard(s)"
            )
        return manifest


def _count(body: dict, key: str, least: int, where: str) -> int:
    """``body[key]``, an integer of at least ``least`` as a writer writes it: not a
    float cut short, a string or a boolean that ``int()`` would take.

    Raises:
        PSCheckpointError: naming ``where``, the field and its value.
        KeyError: the field is missing."""
    value = body[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise PSCheckpointError(
            f"{where}: {key} {str(value)[:40]} is not an integer of at least {least}"
        )
    return value


def _sha(value, where: str) -> str:
    """A SHA-256 as the manifest writes it. Raises PSCheckpointError naming ``where``."""
    if not isinstance(value, str) or not _SHA_RE.match(value):
        raise PSCheckpointError(f"{where}: {str(value)[:70]!r} is not a SHA-256")
    return value


def checkpoint_dir(root: str, checkpoint_id: int) -> str:
    return os.path.join(root, f"ckpt-{checkpoint_id:010d}")


def shard_filename(index: int, num_shards: int) -> str:
    return f"shard-{index:04d}-of-{num_shards:04d}.bin"
