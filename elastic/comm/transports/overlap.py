"""``Overlap``: one job at a time on a thread of its own, beside the caller's thread.

Why: a host leader of a hierarchical round has two kinds of work per piece of an
allreduce, the network step with the other leaders (``TcpRing``) and the shared-memory
steps with its own host (copies and barriers). Run one after the other, the link idles
while the host works. Socket calls, numpy copies and futex waits all release the GIL,
so a second thread keeps the link busy while the first one moves the next pieces.

The job's exception (``PeerGone``, ``Mismatch``, ``Interrupted``...) is raised again by
``wait``. A job still running when its caller gave up on an error is never abandoned:
``close`` waits for it, and its owner calls ``close`` only after aborting what the job
waits on (its sockets), so that wait is short.
"""

from __future__ import annotations

import threading
from typing import Callable

from elastic.comm.transports.base import Check

_CHECK_EVERY = 1.0  # seconds between ``check`` calls while waiting for a job
# ``close`` waits this long at most. A job past it still holds its buffers (numpy views
# keep a shared-memory mapping alive), so giving up on it is safe, never a crash.
_JOIN_TIMEOUT = 10.0


class Overlap:
    """Runs ``start``ed jobs one at a time on a daemon thread named ``name`` (made at the
    first ``start``)."""

    def __init__(self, name: str):
        self._name = name
        self._cv = threading.Condition()
        self._job: Callable[[], None] | None = None
        self._busy = False
        self._error: BaseException | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self, job: Callable[[], None]) -> None:
        """Run ``job()`` on the thread. The previous job must have been waited for.

        Raises:
            RuntimeError: a job is still running, or the overlap is closed.
        """
        with self._cv:
            if self._busy or self._closed:
                raise RuntimeError("overlap is busy or closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
            self._job, self._busy, self._error = job, True, None
            self._cv.notify_all()

    @property
    def busy(self) -> bool:
        """Whether a job is running (it may end any moment)."""
        return self._busy

    def wait(self, check: Check) -> None:
        """Wait until the running job (if any) is done; raise what it raised. ``check``
        runs every second meanwhile and may raise (the job then goes on: see ``close``)."""
        with self._cv:
            while self._busy:
                if not self._cv.wait(_CHECK_EVERY):
                    check()
            error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Let the running job finish, then stop the thread (idempotent; bounded by
        ``_JOIN_TIMEOUT``). The owner has already woken whatever the job waits on."""
        with self._cv:
            self._closed = True
            self._error = None
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(_JOIN_TIMEOUT)

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._busy and not self._closed:
                    self._cv.wait()
                if not self._busy:
                    return
                job = self._job
            error = None
            try:
                assert job is not None
                job()
            except BaseException as e:  # noqa: BLE001 - raised again by wait()
                error = e
            with self._cv:
                self._job, self._busy = None, False
                self._error = None if self._closed else error
                self._cv.notify_all()
