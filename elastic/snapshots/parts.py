"""How a snapshot's arrays are cut into the parts its writers write in parallel (pure).

Every writer computes the same cut from the same leaf sizes (the state is the same on
every member of a round: sync made it so, and data-parallel steps keep it so), so no
one has to hand out the work. A leaf larger than ``chunk`` bytes is cut into pieces of
at most ``chunk`` (one huge tensor must not make one writer do all the work); pieces go
largest first to the part with the fewest bytes so far (ties: the lowest part).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_CHUNK = 64 * 1024 * 1024


@dataclass(frozen=True, order=True)
class Piece:
    """Bytes ``[start, stop)`` of leaf ``leaf``."""

    leaf: int
    start: int
    stop: int

    @property
    def nbytes(self) -> int:
        return self.stop - self.start


def cut(leaf_sizes: Sequence[int], parts: int, chunk: int = DEFAULT_CHUNK) -> list[list[Piece]]:
    """The pieces of each of ``parts`` parts, each part's in leaf and byte order (the
    order its file holds them). Every byte of every leaf is in exactly one piece.

    Raises:
        ValueError: ``parts`` or ``chunk`` below 1, or a negative size.
    """
    if parts < 1 or chunk < 1 or any(size < 0 for size in leaf_sizes):
        raise ValueError(f"cannot cut {list(leaf_sizes)} into {parts} parts of {chunk}")
    pieces = [
        Piece(leaf, start, min(start + chunk, size))
        for leaf, size in enumerate(leaf_sizes)
        for start in range(0, max(size, 1), chunk)
    ]
    load = [(0, part) for part in range(parts)]  # (bytes so far, part): a min-heap
    assigned: list[list[Piece]] = [[] for _ in range(parts)]
    for piece in sorted(pieces, key=lambda p: (-p.nbytes, p.leaf, p.start)):
        total, part = heapq.heappop(load)
        assigned[part].append(piece)
        heapq.heappush(load, (total + piece.nbytes, part))
    return [sorted(part) for part in assigned]
