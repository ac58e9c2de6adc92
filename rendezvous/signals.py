"""Signals handed to a thread (``relay_signals``), the one way our processes take SIGTERM
and SIGINT.

A Python signal handler runs in the main thread between two bytecodes, which may be
while that thread holds the lock inside a ``queue.Queue`` or a ``threading.Event`` (in
``get``, in ``wait``, just after it woke). A handler that takes the same lock (``put``,
``set``) then waits on its own thread forever: the process hangs on the very signal
meant to stop it, while its other threads (a lease's refresh) keep it looking alive.
The handler here only puts the signal's number on a ``queue.SimpleQueue``, whose
``put`` is reentrant; a daemon thread takes it from there and calls ``on_signal``,
where any lock may be taken.
"""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any


def relay_signals(signals: Iterable[int], on_signal: Callable[[int], None]) -> Callable[[], None]:
    """Have each of ``signals`` call ``on_signal(signum)`` in a helper thread, in the
    order they came. Returns what puts the previous handlers back and ends the thread.
    Call it in the main thread (the only one Python lets set handlers).

    Raises:
        ValueError: not called in the main thread.
    """
    arrived: queue.SimpleQueue[int | None] = queue.SimpleQueue()

    def relay() -> None:
        while (signum := arrived.get()) is not None:
            on_signal(signum)

    previous: dict[int, Any] = {}
    for signum in signals:
        previous[signum] = signal.signal(signum, lambda s, _frame: arrived.put(s))
    thread = threading.Thread(target=relay, name="signals", daemon=True)
    thread.start()

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        arrived.put(None)

    return restore
