"""Which round of the job a sync-mode client pushes for (``RoundTracker``)."""

from __future__ import annotations

import threading
from typing import Callable

from ps.errors import PSConfigError

# () -> this worker's (round_id, size, rank), or None when it is in no round
RoundSource = Callable[[], "tuple[int, int, int] | None"]


class RoundTracker:
    """This worker's current ``(round_id, size, rank)``: the newest of what ``set``
    was told and what ``source()`` reports, by default ``(0, 1, 0)``: a worker alone.
    ``newer(round_id)`` says whether a round after ``round_id`` was published.
    Thread-safe."""

    def __init__(
        self, source: RoundSource | None = None, newer: Callable[[int], bool] | None = None
    ):
        self._source = source
        self._newer = newer
        self._lock = threading.Lock()
        self._round = (0, 1, 0)

    def set(self, round_id: int, size: int, rank: int) -> None:
        """Raises PSConfigError for a rank outside the round."""
        if not 0 <= rank < size:
            raise PSConfigError(f"rank {rank} is not in 0..{size - 1}")
        with self._lock:
            self._round = (int(round_id), int(size), int(rank))

    @property
    def follows_a_job(self) -> bool:
        """True when rounds come from the job (a source), not only from ``set``."""
        return self._source is not None

    def current(self) -> tuple[int, int, int]:
        got = self._source() if self._source is not None else None
        with self._lock:
            if got is not None and got[0] >= self._round[0]:
                self._round = (int(got[0]), int(got[1]), int(got[2]))
            return self._round

    def moved(self, round_id: int) -> bool:
        """True once a round after ``round_id`` is known or published."""
        with self._lock:
            if self._round[0] > round_id:
                return True
        return self._newer is not None and self._newer(round_id)
