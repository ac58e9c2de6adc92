"""One call per shard, in parallel, on threads that never wait on themselves.

A client operation fans out to its shards (``Fanout.each``): one task per shard on the
fan-out's threads, and the caller waits for them all. A task must not fan out again:
it would wait on threads of its own pool, and when every thread runs such a task (any
call with one shard, or every shard losing its variables at once) none is left to run
what they wait for, and the client hangs for good. So what a task does to its own shard
(a retry, a re-create of lost variables) stays on that shard, in the task's thread,
and ``each`` refuses to be called from one of its own tasks (``FanoutNestingError``, at
once) rather than deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class FanoutNestingError(RuntimeError):
    """A task of a fan-out tried to fan out again (a bug in the client: see the module)."""


class Fanout:
    """Runs ``fn(index)`` for several indices at once on ``workers`` threads named
    ``name``-N. Thread-safe; ``shutdown`` waits for the tasks under way."""

    def __init__(self, workers: int, name: str):
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self._name = name
        self._local = threading.local()  # ``inside``: this thread runs one of our tasks

    def _task(self, fn: Callable[[int], T], index: int) -> T:
        self._local.inside = True
        try:
            return fn(index)
        finally:
            self._local.inside = False

    def each(self, fn: Callable[[int], T], indices: Iterable[int]) -> dict[int, T]:
        """``fn(index)`` for each index in parallel; the first error is raised after
        every call has finished (no call is left running behind the caller).

        Raises:
            FanoutNestingError: called from one of this fan-out's own tasks.
            Exception: the first error of a call, as it raised it."""
        if getattr(self._local, "inside", False):
            raise FanoutNestingError(
                f"a {self._name} task fanned out again on its own threads; it would "
                "wait on itself (keep a task's work on its own shard)"
            )
        futures = {i: self._pool.submit(self._task, fn, i) for i in indices}
        out: dict[int, T] = {}
        first: BaseException | None = None
        for i, f in futures.items():
            try:
                out[i] = f.result()  # each call is bounded by the client's own deadlines
            except BaseException as exc:  # noqa: BLE001 - raised below, once all have finished
                first = first or exc
        if first is not None:
            raise first
        return out

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
