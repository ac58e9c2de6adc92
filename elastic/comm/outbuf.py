"""Result buffers for large allreduces, recycled once the caller has dropped them.

Why: every allreduce returns a new array. A fresh 64 MiB array comes straight from
mmap, so writing it page-faults and zeroes 16k pages: measured at about 20-25% of a
2-rank 64 MiB shared-memory allreduce on the 2-core test VM. A training loop typically
drops each result right after applying it (``w -= lr * allreduce(g)``), so the memory
of the previous result is free to hold the next one.

Safety: a result handed out is a view of a cached owner array, and every numpy view
(and memoryview, and ``np.frombuffer`` of it) keeps a reference to that owner. So when
the owner's reference count is back to the cache's own reference, no object can reach
that memory and it is reused; otherwise a new owner is allocated. Only on CPython, where
reference counts are exact.
"""

from __future__ import annotations

import sys

import numpy as np
from numpy.typing import DTypeLike

_CPYTHON = sys.implementation.name == "cpython"


def _baseline_refcount() -> int:
    """What ``sys.getrefcount`` reports for an array referenced only by a list slot
    (measured, not assumed: the argument's own reference differs across versions)."""
    probe = [np.empty(1, dtype=np.uint8)]
    return sys.getrefcount(probe[0])


_FREE = _baseline_refcount() if _CPYTHON else -1


class OutputCache:
    """Hands out ``empty(shape, dtype)`` arrays, reusing large ones nobody holds."""

    def __init__(self, min_bytes: int = 1 << 20, max_entries: int = 4):
        self._min = min_bytes
        self._max = max_entries
        self._owners: list[np.ndarray] = []

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not _CPYTHON or nbytes < self._min:
            return np.empty(shape, dtype=dtype)
        owners = self._owners
        for i in range(len(owners)):
            if owners[i].nbytes == nbytes and sys.getrefcount(owners[i]) == _FREE:
                owners.append(owners.pop(i))  # most recently used last
                return owners[-1].view(dtype).reshape(shape)
        if len(owners) >= self._max:
            # Drop a free one if there is one (its memory goes back to the allocator);
            # otherwise forget the oldest (its holder keeps it alive, not us).
            free = [i for i in range(len(owners)) if sys.getrefcount(owners[i]) == _FREE]
            owners.pop(free[0] if free else 0)
        owners.append(np.empty(nbytes, dtype=np.uint8))
        return owners[-1].view(dtype).reshape(shape)

    def clear(self) -> None:
        self._owners = []
