"""Large-buffer allocation that does not page-fault on every step.

A training step moves the same large buffers again and again. glibc serves each
allocation above its mmap threshold with a fresh mapping, so every step pays page
faults on tens of MiB (measured here: a 32 MiB ``bytearray`` filled by a copy costs
~20 ms, the same through ``numpy.empty`` ~4 ms because numpy asks for huge pages, and
a reused heap block ~3 ms). ``buffer`` allocates through numpy; ``tune_malloc`` lets
the smaller messages (gRPC's and ``bytes.join``'s, up to 32 MiB) come from a heap that
is not trimmed after every free.
"""

from __future__ import annotations

import logging
import sys
import threading

import numpy as np

from rendezvous.resources import libc

log = logging.getLogger("ps.memory")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's upper limit on 64-bit systems
_TRIM_THRESHOLD = 512 << 20
_tuned = False


def tune_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds (process-wide, once). Returns False where
    there is no glibc ``mallopt`` (the tuning is only an optimisation)."""
    global _tuned
    if _tuned:
        return True
    mallopt = getattr(libc(), "mallopt", None)
    if mallopt is None:
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )
    _tuned = ok
    log.debug("malloc tuning %s", "applied" if ok else "refused")
    return ok


def buffer(nbytes: int) -> memoryview:
    """A writable, uninitialised byte buffer (numpy-allocated: huge pages where the
    kernel offers them)."""
    return np.empty(nbytes, dtype=np.uint8).data


def unshared(array: np.ndarray | None, holders: int) -> bool:
    """True when nothing but its ``holders`` known references refers to ``array``: no
    view, memoryview or other array is using its memory. Relies on CPython reference
    counts, which every view keeps on its base array (the two extra references are this
    function's argument and ``getrefcount``'s)."""
    return array is not None and sys.getrefcount(array) == holders + 2


class BufferPool:
    """Byte buffers that are handed out again once nothing refers to them any more
    (steady training uploads the same sizes every step; reusing a buffer avoids
    faulting in fresh pages each time). Holds at most ``keep`` idle buffers."""

    def __init__(self, keep: int = 8):
        self._keep = keep
        self._buffers: list[np.ndarray] = []
        self._lock = threading.Lock()

    def get(self, nbytes: int) -> memoryview:
        with self._lock:
            for i in range(len(self._buffers)):
                # holders: the list's reference; a view handed out earlier adds its own
                if self._buffers[i].nbytes == nbytes and unshared(self._buffers[i], 1):
                    return self._buffers[i].data
            array = np.empty(nbytes, dtype=np.uint8)
            self._buffers.append(array)
            if len(self._buffers) > self._keep:
                self._buffers.pop(0)  # forgotten here; freed once its user drops it
            return array.data
