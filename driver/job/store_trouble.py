"""When the job's store last failed to answer in time (``StoreTrouble``), as the driver's
health probe saw it: what tells a lease that lapsed because its holder was cut off from
one that lapsed because the store itself stalled (``driver.policy.lapses``).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from driver.policy.lapses import lapse_explained

#: a look at the store that takes longer than this is trouble too (etcd answers a
#: revision read in milliseconds; a stalled one holds the call)
SLOW_ANSWER = 1.0


class StoreTrouble:
    """The latest moment the store was seen not answering in time (thread-safe: the
    probe's thread notes, the agents' feeds read)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: float | None = None
        self._asking_since: float | None = None

    def asking(self) -> None:
        """A look at the store begins (one at a time)."""
        with self._lock:
            self._asking_since = self._clock()

    def answered(self, ok: bool) -> None:
        """The look began by ``asking`` ended: answered (``ok``) or not. Not answered, or
        answered late, is trouble up to now."""
        now = self._clock()
        with self._lock:
            began, self._asking_since = self._asking_since, None
            if not ok or (began is not None and now - began > SLOW_ANSWER):
                self._latest = now

    def latest(self) -> float | None:
        """The latest moment of trouble: now while a look has been waiting for longer
        than ``SLOW_ANSWER`` (the store stalls at this moment), else the last noted."""
        now = self._clock()
        with self._lock:
            if self._asking_since is not None and now - self._asking_since > SLOW_ANSWER:
                return now
            return self._latest

    def explains_lapse(self) -> bool:
        """``lapse_explained`` as of now."""
        return lapse_explained(self.latest(), self._clock())
