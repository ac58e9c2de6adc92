"""Writing a large file around the page cache (``UncachedFile``).

A snapshot's part is written once and read only after a failure, so caching it buys
nothing, and filling the cache costs the training processes: the kernel copies every
byte into freshly allocated cache pages (on a virtual machine, pages the host must back
first: ~170 ms of CPU per 50 MB on our 2-core VM, against ~10 ms around the cache),
and a snapshot of tens of GB evicts what training reads. So the bytes go to the disk
directly (Linux ``O_DIRECT``), through a page-aligned staging buffer (``O_DIRECT``
wants the memory, the offset and the length aligned to the device's block: a tensor's
memory is not).

Where the file system refuses ``O_DIRECT`` (at open, or at the first write: tmpfs on
older kernels, some network file systems), the file is written through the cache
instead, the same bytes. Durability is the caller's: ``O_DIRECT`` does not flush the
device's own cache, so ``os.fsync`` is still needed.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os

import numpy as np

ALIGN = 4096
"""Alignment of every uncached write: the largest logical block of common devices."""

STAGING = 4 * 1024 * 1024
"""Bytes staged per uncached write (a multiple of ``ALIGN``)."""

_DIRECT = getattr(os, "O_DIRECT", 0)  # 0 where the platform has none


class UncachedFile:
    """A new file at ``path`` (created, or truncated), written in order: ``write``,
    then ``flush`` (writes what is staged), ``os.fsync(f.fileno())`` and ``close``; a
    context manager, as a file is.

    Raises (when made):
        OSError: the file cannot be created.
    """

    def __init__(self, path: str, mode: int = 0o666):
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self._fd = -1
        self._direct = False
        if _DIRECT:
            try:
                self._fd = os.open(path, flags | _DIRECT, mode)
                self._direct = True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
        if self._fd < 0:
            self._fd = os.open(path, flags, mode)
        # Page-aligned memory (an anonymous mapping), as O_DIRECT wants it.
        self._staging: np.ndarray | None = (
            np.frombuffer(mmap.mmap(-1, STAGING), dtype=np.uint8) if self._direct else None
        )
        self._staged = 0
        self._on_disk = 0  # bytes written so far (where the staged ones go)

    @property
    def direct(self) -> bool:
        """Whether the bytes still go around the page cache."""
        return self._direct

    def fileno(self) -> int:
        return self._fd

    def tell(self) -> int:
        """Bytes written so far."""
        return self._on_disk + self._staged

    def __enter__(self) -> UncachedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, data: memoryview | bytes) -> None:
        """Append ``data``.

        Raises:
            OSError: the disk refuses it (a full disk among others).
        """
        view = memoryview(data).cast("B")
        if self._staging is None:
            self._write_all(view, self._on_disk)
            self._on_disk += view.nbytes
            return
        done = 0
        while done < view.nbytes:
            take = min(view.nbytes - done, STAGING - self._staged)
            # numpy copies without the GIL (a slice assignment of an mmap holds it,
            # stalling the training thread)
            np.copyto(
                self._staging[self._staged : self._staged + take],
                np.frombuffer(view[done : done + take], dtype=np.uint8),
            )
            self._staged += take
            done += take
            if self._staged == STAGING:
                self._flush_staged()

    def flush(self) -> None:
        """Write what is staged: its aligned head around the cache, a tail shorter than
        a block through it (so, once a tail was written, later bytes go through it too).

        Raises:
            OSError: the disk refuses them.
        """
        if self._staged:
            self._flush_staged()

    def close(self) -> None:
        """Close the file (what is still staged is dropped: ``flush`` first)."""
        # The staging buffer is unmapped with its last reference, not closed here: a
        # write that raised leaves views of it in the traceback, and an mmap with views
        # refuses to close (BufferError, which would hide the OSError).
        self._staging = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _flush_staged(self) -> None:
        assert self._staging is not None
        staged = self._staging.data[: self._staged]
        head = self._staged - self._staged % ALIGN if self._direct else 0
        if head:
            try:
                self._write_all(staged[:head], self._on_disk)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._stop_direct()  # the file system takes no O_DIRECT writes
                head = 0
        if head < self._staged:
            # A tail shorter than a block: only the cache takes it. Nothing is
            # written uncached after it (it is the file's end), so this is for good.
            self._stop_direct()
            self._write_all(staged[head:], self._on_disk + head)
        self._on_disk += self._staged
        self._staged = 0

    def _stop_direct(self) -> None:
        if self._direct:
            flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
            fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~_DIRECT)
            self._direct = False

    def _write_all(self, view: memoryview, offset: int) -> None:
        """``view`` at ``offset`` (a retry after a refused uncached write writes the
        same bytes at the same place)."""
        done = 0
        while done < view.nbytes:
            done += os.pwrite(self._fd, view[done:], offset + done)
