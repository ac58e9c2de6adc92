"""How far this process's training got, cheaply, and the rule that tells a hung training
from a slow one (pure).

``CLOCK`` is this process's ``TrainingClock``. Every collective of the ring
(``RingCommunicator._run``) and of ``elastic.torch``'s process groups, and every
``State.commit``, notes when it starts and ends (``enter``, ``leave``; ``committed``
also keeps the time since the commit before, a step's length); ``@elastic.run`` says
when its training function runs (``start_training``, ``stop_training``). That is a lock
and a clock read per collective: nothing next to the collective itself.

A worker is *hung* (``stalled_for``, ``hang_after``) when its training function runs,
no collective or commit of it is in flight, and none started or ended for longer than
its timeout (``hang_timeout``): the training does not reach its next collective. A
worker waiting in a collective for a hung peer is not hung (it is in one); nor is one
waiting for a round, syncing, or outside the training function (a script's end, its
imports, its data loading before ``@elastic.run``). The timeout is the one given
(``--hang-timeout``), or adapts: ``HANG_FACTOR`` times the median of the recent steps
(commit to commit), never below ``HANG_FLOOR`` (a first step's compile or load; a slow
loaded machine). ``elastic.hangs.watchdog`` watches the clock from a thread of its own.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass

from rendezvous.env import HANG_FACTOR, HANG_FLOOR

#: steps (commit to commit) the adaptive timeout takes its median over
KEPT_STEPS = 64


@dataclass(frozen=True)
class ClockView:
    """The clock at one moment: whether the training function runs (``training``, on
    thread ``thread_id``), how many collectives or commits are in flight (``busy``), the
    monotonic time of the last start or end of one (or of the training's start:
    ``since``), and the recent steps' seconds (``steps``)."""

    training: bool
    busy: int
    since: float
    steps: tuple[float, ...] = ()
    thread_id: int | None = None


class TrainingClock:
    """When this process's training last entered or left a collective (see the module
    docstring). Thread-safe; every method is cheap and never raises."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._training = False
        self._busy = 0
        self._since = time.monotonic()
        self._last_commit: float | None = None
        self._steps: deque[float] = deque(maxlen=KEPT_STEPS)
        self._thread_id: int | None = None

    def start_training(self) -> None:
        """The training function starts (again, after a re-form) on this thread."""
        with self._lock:
            self._training = True
            self._busy = 0
            self._since = time.monotonic()
            self._last_commit = None  # a re-form's gap is no step
            self._thread_id = threading.get_ident()

    def stop_training(self) -> None:
        """The training function returned or raised."""
        with self._lock:
            self._training = False

    def enter(self) -> None:
        """A collective (or a commit) starts."""
        with self._lock:
            self._busy += 1
            self._since = time.monotonic()

    def leave(self) -> None:
        """A collective (or a commit) ended, however."""
        with self._lock:
            self._busy = max(0, self._busy - 1)
            self._since = time.monotonic()

    def committed(self) -> None:
        """A commit ended (it ``enter``ed): as ``leave``, and one more step's length."""
        with self._lock:
            now = time.monotonic()
            self._busy = max(0, self._busy - 1)
            self._since = now
            if self._training and self._last_commit is not None:
                self._steps.append(now - self._last_commit)
            self._last_commit = now

    def view(self) -> ClockView:
        with self._lock:
            return ClockView(
                self._training, self._busy, self._since, tuple(self._steps), self._thread_id
            )


CLOCK = TrainingClock()
"""This process's training clock."""


@dataclass(frozen=True)
class HangSettings:
    """``timeout``: the seconds given (``--hang-timeout``; 0: never hung), or None: adapt,
    ``factor`` times the median step, never below ``floor``."""

    timeout: float | None = None
    floor: float = HANG_FLOOR
    factor: float = HANG_FACTOR

    @property
    def off(self) -> bool:
        return self.timeout is not None and self.timeout <= 0


def hang_timeout(settings: HangSettings, steps: tuple[float, ...]) -> float:
    """The seconds without a collective after which the training is hung (0: never)."""
    if settings.timeout is not None:
        return max(settings.timeout, 0.0)
    if not steps:
        return settings.floor
    return max(settings.floor, settings.factor * statistics.median(steps))


def stalled_for(view: ClockView, now: float) -> float:
    """Seconds the training has gone without starting or ending a collective (0 while
    one is in flight, or outside the training function)."""
    if not view.training or view.busy > 0:
        return 0.0
    return max(0.0, now - view.since)


def hang_after(view: ClockView, now: float, settings: HangSettings) -> float | None:
    """The timeout the training outlived, at ``now`` (None: it is not hung)."""
    timeout = hang_timeout(settings, view.steps)
    if timeout <= 0:
        return None
    return timeout if stalled_for(view, now) >= timeout else None
