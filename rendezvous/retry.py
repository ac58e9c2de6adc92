"""One helper for every "try again after a growing pause, until a deadline" loop.

``Backoff`` holds the schedule (doubling delays from ``initial`` up to ``cap``) and the
deadline; the loop around it decides what is worth retrying:

    backoff = Backoff.within(10.0, initial=0.05, cap=1.0)
    while True:
        try:
            return call()
        except ConnectionError:
            if not backoff.pause():
                raise

``pause()`` sleeps for the next delay and returns True, or returns False at once when
that delay would pass the deadline (the caller then gives up with its own error). A
``stop`` event cuts a pause short, so a thread that retries still stops promptly. The
clock and the sleep are injectable, so a schedule can be unit-tested without waiting.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class Backoff:
    """Doubling pauses until a monotonic ``deadline`` (None: no deadline).

    Raises ValueError for a non-positive ``initial`` or a ``cap`` below it."""

    def __init__(
        self,
        deadline: float | None,
        *,
        initial: float = 0.05,
        cap: float = 1.0,
        factor: float = 2.0,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ):
        if not initial > 0 or not cap >= initial or not factor >= 1:
            raise ValueError(f"bad backoff schedule: initial={initial}, cap={cap}, factor={factor}")
        self.deadline = deadline
        self.delay = initial
        self._cap = cap
        self._factor = factor
        self._stop = stop
        self._clock = clock
        self._sleep = sleep
        self.attempts = 0

    @classmethod
    def within(cls, seconds: float, **kwargs) -> Backoff:
        """A backoff whose deadline is ``seconds`` from now (by ``clock``, if given)."""
        clock = kwargs.get("clock", time.monotonic)
        return cls(clock() + seconds, **kwargs)

    def remaining(self) -> float:
        """Seconds left before the deadline (inf without one; never negative)."""
        if self.deadline is None:
            return float("inf")
        return max(0.0, self.deadline - self._clock())

    def expired(self) -> bool:
        return self.deadline is not None and self._clock() >= self.deadline

    def pause(self, *, clip: bool = False) -> bool:
        """Sleep for the next delay and return True; return False without sleeping when
        the delay would pass the deadline or ``stop`` is set. With ``clip``, a delay
        that would pass the deadline is shortened to it instead (one last try exactly
        at the deadline), and False comes only once the deadline has passed."""
        if self._stop is not None and self._stop.is_set():
            return False
        delay = self.delay
        left = self.remaining()
        if delay > left:
            if not clip or left <= 0:
                return False
            delay = left
        self.attempts += 1
        self.delay = min(self.delay * self._factor, self._cap)
        if self._stop is not None:
            return not self._stop.wait(delay)
        self._sleep(delay)
        return True
