"""The seam between ``elastic.torch`` and the worker's collectives (the one module that
would change when the core grows what torch needs; see the notes below).

Everything here goes through the public worker API (``elastic.allreduce`` ...), so it
works with whatever communicator ``elastic.init()`` chose (TCP/shared-memory ring, MPI,
a world of one) and follows re-forms by itself: each call asks ``elastic`` for the
current round's communicator.

Two things the core does not offer yet, shimmed here:

* In-place results. ``allreduce_into`` / ``broadcast_into`` run the copying collective
  and copy the result into the caller's array: one extra copy that an ``out=``
  argument on ``Communicator.allreduce``/``broadcast`` would remove.
* Collectives that overlap the caller. ``CommThread`` runs the blocking collectives on
  one dedicated thread, in submission order. That is safe because a communicator only
  needs one collective at a time, from any thread (``Communicator`` docstring); the
  caller (``DistributedOptimizer``) makes sure no other thread runs a collective while
  work is queued here. A non-blocking ``allreduce_async() -> handle`` in the
  communicator would replace this thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

import elastic

log = logging.getLogger(__name__)


def world_size() -> int:
    return elastic.size()


def world_rank() -> int:
    return elastic.rank()


def allreduce_array(arr: np.ndarray, op: str) -> np.ndarray:
    """A new array: ``arr`` reduced over the world. Raises like ``elastic.allreduce``."""
    return elastic.allreduce(arr, op=op)


def allreduce_into(arr: np.ndarray, op: str) -> np.ndarray:
    """Reduce ``arr`` in place (shim: one copy of the result into ``arr``)."""
    np.copyto(arr, elastic.allreduce(arr, op=op))
    return arr


def broadcast_array(arr: np.ndarray | None, root: int) -> np.ndarray:
    """``root``'s ``arr`` on every rank (a new array; ``arr`` unused off the root)."""
    return elastic.broadcast(arr, root=root)


def broadcast_into(arr: np.ndarray, root: int) -> np.ndarray:
    """``root``'s ``arr`` copied into every rank's ``arr`` (shapes must agree).

    Raises ValueError when root's array has another shape or dtype than ``arr``."""
    result = elastic.broadcast(arr, root=root)
    if result.shape != arr.shape or result.dtype != arr.dtype:
        raise ValueError(
            f"broadcast from rank {root}: it sent {result.dtype}{result.shape}, "
            f"this rank expects {arr.dtype}{arr.shape}"
        )
    if elastic.rank() != root:
        np.copyto(arr, result)
    return arr


def allgather_array(arr: np.ndarray) -> np.ndarray:
    return elastic.allgather(arr)


def broadcast_object(obj: Any, root: int) -> Any:
    return elastic.broadcast_object(obj, root=root)


def allgather_object(obj: Any) -> list:
    return elastic.allgather_object(obj)


class CommThread:
    """One daemon thread that runs submitted callables in submission order.

    ``submit(fn)`` returns a ``Future`` holding ``fn()``'s result or exception. The
    thread starts at the first submit and lives as long as the process (it is idle,
    blocked on its queue, between jobs)."""

    def __init__(self, name: str = "elastic-torch-comm"):
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
        self._queue.put((fn, future))
        return future

    def _loop(self) -> None:
        while True:
            fn, future = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on it
                future.set_exception(exc)


_comm_thread = CommThread()


def comm_thread() -> CommThread:
    """The process's communication thread (shared by every DistributedOptimizer, so
    their collectives keep one order)."""
    return _comm_thread
