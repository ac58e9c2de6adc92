"""One warning per interval for each kind of refusal (``RateLimitedLog``): what a server
refusing a flood of calls, or a client ignoring a flood of forged records, says without
drowning its log."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class RateLimitedLog:
    """One warning per ``interval`` for a kind of refusal, with the count since the last
    (thread-safe). ``noun`` names what was refused in that count ("calls", "records")."""

    def __init__(
        self,
        interval: float = 10.0,
        logger: logging.Logger = log,
        noun: str = "calls",
        clock: Callable[[], float] = time.monotonic,
    ):
        self._interval = interval
        self._log = logger
        self._noun = noun
        self._clock = clock
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def warn(self, kind: str, message: str) -> bool:
        """Say ``message`` unless ``kind`` was said within the interval; True when said."""
        now = self._clock()
        with self._lock:
            count = self._count[kind] = self._count.get(kind, 0) + 1
            if now < self._next.get(kind, 0.0):
                return False
            self._count[kind] = 0
            self._next[kind] = now + self._interval
        self._log.warning("%s (%d such %s since the last line)", message, count, self._noun)
        return True
