"""The shard's half of large transfers: payloads staged for the bulk port.

A request whose payload is above the client's chunk size names an upload instead of
carrying the bytes: the client has first put the upload's parts (``Part``) through the
bulk port into a buffer here. A reply above the caller's ``inline_max`` is staged as a
download: the reply header says so (``Staged``), the client gets the parts through the
bulk port and then releases it (``Release``). Entries unused for ``ttl`` seconds vanish
(their client died or gave up).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from ps.errors import PSTransferError
from ps.memory import BufferPool
from ps.protocol import Part, Staged
from ps.wire import as_pieces, cut, size_of
from rendezvous.net.rpc_wire import frame


@dataclass
class _Upload:
    buffer: memoryview
    used: float
    parts: dict[int, int] = field(default_factory=dict)  # offset -> length, once written


@dataclass
class _Download:
    pieces: list[memoryview]
    size: int
    used: float


class Staging:
    """Uploads and downloads in progress, by id (thread-safe)."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic):
        self._ttl, self._clock = ttl, clock
        self._lock = threading.Lock()
        self._uploads: dict[str, _Upload] = {}
        self._downloads: dict[str, _Download] = {}
        self._pool = BufferPool()

    def _expire(self) -> None:
        limit = self._clock() - self._ttl
        for table in (self._uploads, self._downloads):
            for key in [k for k, v in table.items() if v.used < limit]:
                del table[key]

    def upload_view(self, part: Part) -> memoryview:
        """Where ``part`` of an upload goes; call ``upload_done`` once it is written.

        Raises:
            PSTransferError: the part lies outside the upload, the upload's size
                changed, or there is no memory for it."""
        if part.offset < 0 or part.length < 0 or part.offset + part.length > part.total:
            raise PSTransferError(
                f"upload part {part.offset}+{part.length} outside {part.total} bytes"
            )
        with self._lock:
            self._expire()
            entry = self._uploads.get(part.id)
            if entry is None:
                try:
                    buffer = self._pool.get(part.total)
                except MemoryError:
                    raise PSTransferError(
                        f"upload {part.id}: no memory for {part.total} bytes"
                    ) from None
                entry = self._uploads[part.id] = _Upload(buffer, 0.0)
            elif len(entry.buffer) != part.total:
                raise PSTransferError(f"upload {part.id} changed its size")
            entry.used = self._clock()
            # parts are disjoint: written unlocked
            return entry.buffer[part.offset : part.offset + part.length]

    def upload_done(self, part: Part) -> None:
        with self._lock:
            entry = self._uploads.get(part.id)
            if entry is not None:
                entry.parts[part.offset] = part.length

    def take_upload(self, upload_id: str) -> memoryview:
        """The whole uploaded payload (removed from staging).

        Raises:
            PSTransferError: the upload is unknown (expired, shard restarted) or
                incomplete."""
        with self._lock:
            entry = self._uploads.pop(upload_id, None)
        if entry is None:
            raise PSTransferError(f"unknown upload {upload_id}")
        if sum(entry.parts.values()) != len(entry.buffer):
            raise PSTransferError(f"upload {upload_id} is incomplete")
        return entry.buffer

    def offer(self, payload) -> str:
        """Stage ``payload`` (bytes-like or pieces, uncopied) as a new download."""
        pieces = as_pieces(payload)
        download = uuid.uuid4().hex
        with self._lock:
            self._expire()
            self._downloads[download] = _Download(pieces, size_of(pieces), self._clock())
        return download

    def download_pieces(self, part: Part) -> list[memoryview]:
        """The bytes of ``part`` of a download, uncopied.

        Raises:
            PSTransferError: the download is unknown (expired, released) or the part
                lies outside it."""
        with self._lock:
            entry = self._downloads.get(part.id)
            if entry is None:
                raise PSTransferError(f"unknown download {part.id}")
            entry.used = self._clock()
        if part.offset < 0 or part.length < 0 or part.offset + part.length > entry.size:
            raise PSTransferError(
                f"download part {part.offset}+{part.length} outside {entry.size} bytes"
            )
        return cut(entry.pieces, part.offset, part.length)

    def release(self, download_id: str) -> None:
        with self._lock:
            self._downloads.pop(download_id, None)

    def reply(self, header: dict, payload, inline_max: int) -> bytes:
        """A reply frame; a payload above ``inline_max`` bytes is staged instead."""
        pieces = as_pieces(payload)
        size = size_of(pieces)
        if size > inline_max:
            return frame({**header, **Staged(self.offer(pieces), size).to_dict()})
        return frame(header, pieces)
