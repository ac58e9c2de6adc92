"""``relay_signals``: a signal becomes a call in a helper thread, so that what the call
does may take the locks the main thread holds when the signal comes (a ``queue.Queue``'s,
a ``threading.Event``'s): the hang a handler that takes them can cause."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import pytest

from rendezvous.signals import relay_signals


def _held() -> int:
    return 1  # a Python call inside the lock: a point where a handler may run


@pytest.mark.timeout(60)
def test_signals_that_land_while_the_main_thread_holds_the_lock_they_take_are_all_taken():
    """The main thread takes and drops a lock in a loop, calling Python code while it
    holds it (as ``Queue.get`` and ``Event.wait`` do), while another thread sends
    signals; each signal's call takes the same lock. A handler that took it itself would
    wait on its own thread (here: forever, or until nested handlers overflow the stack).
    Relayed, every call completes."""
    lock = threading.Lock()
    calls: list[int] = []
    stop = threading.Event()

    def sender() -> None:
        while not stop.wait(0.001):
            os.kill(os.getpid(), signal.SIGUSR1)

    def on_signal(signum: int) -> None:
        with lock:
            calls.append(signum)

    restore = relay_signals((signal.SIGUSR1,), on_signal)
    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            with lock:
                _held()
                _held()
    finally:
        stop.set()
        thread.join(timeout=5)
        restore()
    assert len(calls) > 100 and signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_the_call_runs_off_the_main_thread_and_restore_ends_it():
    threads: queue.SimpleQueue[str] = queue.SimpleQueue()
    restore = relay_signals(
        (signal.SIGUSR2,), lambda s: threads.put(threading.current_thread().name)
    )
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert threads.get(timeout=10) == "signals"
    finally:
        restore()
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL


@pytest.mark.timeout(30)
def test_a_signal_the_kernel_hands_to_another_thread_is_taken_while_main_waits():
    """The main thread blocks in a long ``wait``; the signal goes to another thread
    (``pthread_kill``, as the kernel may do with one sent to the process). A Python
    handler would run only once the main thread's wait ended; the relay takes it now."""
    taken = threading.Event()
    restore = relay_signals((signal.SIGUSR1,), lambda _s: taken.set())
    receiver = threading.Thread(
        target=lambda: signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
    )
    try:
        receiver.start()
        assert taken.wait(10), "the signal waited for the main thread"
    finally:
        receiver.join(timeout=5)
        restore()
