"""How the store answered one process's looks at it (``StoreReach``): since when it has
been away, and when it last was. A look that fails, or that waits for longer than
``SLOW_ANSWER``, is trouble: a stalled etcd (a leader election, a disk stall, SIGSTOP)
keeps its connections open and holds a call rather than refusing it, so the time a
call has been waiting counts as much as a call that failed.

Read by the driver's store probe (``driver.job.store_trouble``: which lapsed leases
the store explains, and the bound on an outage) and by a worker's rank 0 (its progress
writes: while the store is away, its snapshots are written alone,
``elastic.snapshots.snapshotter``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable

from rendezvous.errors import RendezvousError

#: a look at the store that takes longer than this is trouble too (etcd answers a
#: revision read or a put in milliseconds; a stalled one holds the call)
SLOW_ANSWER = 1.0


class StoreReach:
    """The store as one process's looks found it (thread-safe: the looking thread
    notes, others read). Looks are one at a time (a single thread makes them)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, slow: float = SLOW_ANSWER):
        self._clock = clock
        self._slow = slow
        self._lock = threading.Lock()
        self._latest: float | None = None  # the latest moment of trouble
        self._away_since: float | None = None  # the start of the trouble going on
        self._asking_since: float | None = None

    def asking(self) -> None:
        """A look at the store begins."""
        with self._lock:
            self._asking_since = self._clock()

    def answered(self, ok: bool) -> None:
        """The look begun by ``asking`` ended: answered (``ok``) or not. Not answered,
        or answered late, is trouble up to now; an answer ends the outage."""
        now = self._clock()
        with self._lock:
            began, self._asking_since = self._asking_since, None
            if ok:  # (late or not, the store answers again)
                self._away_since = None
                if began is not None and now - began > self._slow:
                    self._latest = now
                return
            self._latest = now
            if self._away_since is None:
                self._away_since = began if began is not None else now

    @contextmanager
    def looking(self) -> Iterator[None]:
        """``asking`` around the body; a ``RendezvousError`` out of it is a look not
        answered (and goes on to the caller).

        Raises:
            RendezvousError: the body's."""
        self.asking()
        try:
            yield
        except RendezvousError:
            self.answered(False)
            raise
        self.answered(True)

    def latest(self) -> float | None:
        """The latest moment of trouble: now while a look has been waiting for longer
        than the slow bound (the store stalls at this moment), else the last noted."""
        now = self._clock()
        with self._lock:
            if self._asking_since is not None and now - self._asking_since > self._slow:
                return now
            return self._latest

    def away_for(self) -> float:
        """For how long the store has not answered in time, up to now (0.0 while it
        does): since the first look of the trouble going on, or since the look that has
        been waiting for longer than the slow bound."""
        now = self._clock()
        with self._lock:
            since = self._away_since
            if self._asking_since is not None and now - self._asking_since > self._slow:
                since = self._asking_since if since is None else min(since, self._asking_since)
            return 0.0 if since is None else now - since
