"""Signals handed to a thread (``relay_signals``), the one way our processes take SIGTERM
and SIGINT.

Two traps of Python's signal handlers, both seen here as a process that ignored the
very signal meant to stop it:

* A handler runs in the main thread between two bytecodes, which may be while that
  thread holds the lock inside a ``queue.Queue`` or a ``threading.Event`` (in ``get``,
  in ``wait``, just after it woke). A handler that takes the same lock (``put``, ``set``)
  waits on its own thread for ever, while the other threads (a lease's refresh) keep the
  process looking alive.
* A signal the kernel hands to another thread (any thread may receive one sent to the
  process; ours have gRPC's and the store watches') only marks the handler as due: it
  runs when the main thread next runs Python code, which a main thread blocked in a long
  ``wait`` does not do until the wait ends (seconds, or minutes).

So the handler does nothing, and the signal is read elsewhere: Python's C-level handler,
in whatever thread the signal lands, writes its number to the wakeup fd
(``signal.set_wakeup_fd``), a pipe that a daemon thread reads at once and hands each
signal to ``on_signal``, where any lock may be taken.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any


def _noted(_signum: int, _frame: FrameType | None) -> None:
    """The Python-level handler: nothing (the wakeup fd carried the signal already)."""


def relay_signals(signals: Iterable[int], on_signal: Callable[[int], None]) -> Callable[[], None]:
    """Have each of ``signals`` call ``on_signal(signum)`` in a helper thread, in the
    order they came, wherever the kernel delivered them. Returns what puts the previous
    handlers and wakeup fd back and ends the thread. Call it in the main thread (the only
    one Python lets set handlers), once at a time per process (there is one wakeup fd).

    Raises:
        ValueError: not called in the main thread.
    """
    wanted = frozenset(int(s) for s in signals)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the C handler must never block on a full pipe
    try:
        previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        previous: dict[int, Any] = {s: signal.signal(s, _noted) for s in wanted}
    except ValueError:
        os.close(read_fd)
        os.close(write_fd)
        raise

    def relay() -> None:
        try:
            while data := os.read(read_fd, 64):  # b"": restore() closed the write end
                for signum in data:  # one byte per signal, its number
                    if signum in wanted:
                        on_signal(signum)
        finally:
            os.close(read_fd)

    threading.Thread(target=relay, name="signals", daemon=True).start()

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(previous_fd)
        with contextlib.suppress(OSError):
            os.close(write_fd)

    return restore
