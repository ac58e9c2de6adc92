"""Deterministic placement of variables on shards (pure).

A variable of at most ``threshold`` bytes lives whole on one shard chosen by a stable
hash of its name. A larger one is split on axis 0 into contiguous row ranges, one per
shard, as equal as possible (the first ``rows % parts`` ranges get one extra row);
range ``k`` goes to shard ``(home + k) % num_shards`` so that the leftover rows of many
variables do not all pile onto shard 0.

Placement of one variable depends only on its own name, shape and dtype, the shard
count and the threshold, so it never changes when other variables are added, and a
checkpoint written under one shard count can be re-cut for another (``assemble``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Slice:
    """Rows ``[start, stop)`` on axis 0 of variable ``name`` (of ``full_shape``), held by
    ``shard``. A 0-d variable has the single pseudo-row ``[0, 1)``."""

    name: str
    shard: int
    start: int
    stop: int
    full_shape: tuple[int, ...]
    dtype: str

    @property
    def rows(self) -> int:
        return self.full_shape[0] if self.full_shape else 1

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop == self.rows

    @property
    def shape(self) -> tuple[int, ...]:
        if not self.full_shape:
            return ()
        return (self.stop - self.start,) + tuple(self.full_shape[1:])

    def take(self, array: np.ndarray) -> np.ndarray:
        """This slice's part of a full-shaped ``array`` (a view, no copy)."""
        return array if not self.full_shape else array[self.start : self.stop]

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "shard": self.shard,
            "start": self.start,
            "stop": self.stop,
            "full_shape": list(self.full_shape),
            "dtype": self.dtype,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Slice:
        return cls(
            d["name"],
            int(d["shard"]),
            int(d["start"]),
            int(d["stop"]),
            tuple(int(x) for x in d["full_shape"]),
            str(d["dtype"]),
        )


def home_shard(name: str, num_shards: int) -> int:
    """The shard of an unsplit variable: crc32 of the name (stable across processes and
    Python versions, unlike ``hash``)."""
    return zlib.crc32(name.encode("utf-8")) % num_shards


def row_ranges(rows: int, parts: int) -> list[tuple[int, int]]:
    """``rows`` cut into ``parts`` contiguous ranges whose sizes differ by at most one."""
    if parts < 1:
        raise ValueError("parts must be >= 1")
    base, extra = divmod(rows, parts)
    ranges, start = [], 0
    for k in range(parts):
        stop = start + base + (1 if k < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def place(
    name: str, shape: tuple[int, ...], dtype, num_shards: int, threshold: int
) -> tuple[Slice, ...]:
    """The slices of one variable, in row order. Raises ValueError for a bad shard count."""
    if num_shards < 1:
        raise ValueError("num_shards must be >= 1")
    shape = tuple(int(x) for x in shape)
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    home = home_shard(name, num_shards)
    rows = shape[0] if shape else 1
    parts = min(num_shards, rows) if shape and nbytes > threshold else 1
    return tuple(
        Slice(name, (home + k) % num_shards, start, stop, shape, dt.str)
        for k, (start, stop) in enumerate(row_ranges(rows, parts))
    )


def slice_for(
    name: str, shape: tuple[int, ...], dtype, shard: int, num_shards: int, threshold: int
) -> Slice | None:
    """The slice of ``name`` that ``shard`` holds, or None."""
    for s in place(name, shape, dtype, num_shards, threshold):
        if s.shard == shard:
            return s
    return None


def assemble(target: Slice, sources: list[tuple[Slice, np.ndarray]]) -> np.ndarray:
    """Rows ``target.start:target.stop`` of one variable built from other slices of it
    (e.g. a checkpoint written under another shard count). A 0-d or row-less source
    (a scalar optimizer slot) is taken as is. Raises ValueError when the sources do not
    cover the target."""
    for _, array in sources:
        if array.ndim == 0:
            return np.array(array, copy=True)
    out = np.empty(target.shape, dtype=np.dtype(target.dtype))
    if not target.full_shape:
        for _, array in sources:
            out[...] = array
            return out
        raise ValueError(f"no source for {target.name}")
    covered = 0
    for src, array in sources:
        lo, hi = max(src.start, target.start), min(src.stop, target.stop)
        if lo >= hi:
            continue
        out[lo - target.start : hi - target.start] = array[lo - src.start : hi - src.start]
        covered += hi - lo
    if covered != target.stop - target.start:
        raise ValueError(
            f"slices of {target.name} cover {covered} of rows {target.start}:{target.stop}"
        )
    return out
