"""Background threads that yield the CPU to the training path."""

from __future__ import annotations

import contextlib
import os
import threading

BACKGROUND_NICENESS = 19
"""The lowest priority a thread can take without privileges: it runs when a CPU would
otherwise wait (a worker blocked in a collective), and still progresses when none does."""


def lower_this_thread(niceness: int = BACKGROUND_NICENESS) -> None:
    """Give the calling thread ``niceness`` (Linux: niceness is per thread; threads it
    starts inherit it). Best effort: where it cannot, the thread keeps its priority."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
