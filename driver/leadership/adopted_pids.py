"""Workers another driver launched, that a driver taking over a job adopts.

The new leader knows them from their registrations (worker id, host, pid), not from a
process it started: it cannot wait on their exit codes. On this machine it can still
watch and signal them: a pidfd tells when the process is gone (``on_gone``), and a
signal goes to it after checking that the pid still runs that worker (its environment
names the worker id: a pid reused by another program is never signalled). On another
host (until the per-host agents report process records) the leader learns a death from
the worker's registration lapsing or its peers' reports, and cannot signal it: a kill
or stop there gives the worker up at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from typing import Callable

from driver.launch.process import STOP_GRACE
from driver.threads import spawn
from rendezvous import env

log = logging.getLogger(__name__)

EXIT_UNKNOWN = -1
"""The exit code an adopted worker's exit is reported with: nobody can tell its code."""


def runs_worker(pid: int, worker_id: str) -> bool:
    """Whether process ``pid`` of this machine is worker ``worker_id`` (its environment
    says so); False when it is gone or cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return False
    return f"{env.ENV_WORKER_ID}={worker_id}".encode() in environ.split(b"\0")


class AdoptedProcesses:
    """The adopted workers by id. ``on_gone(worker_id)`` is called (from a helper
    thread, or at once) when one is known to be gone."""

    def __init__(self, on_gone: Callable[[str], None]):
        self._on_gone = on_gone
        self._local: dict[str, int] = {}  # worker id -> pid, on this machine
        self._remote: set[str] = set()
        self._lock = threading.Lock()

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._local or worker_id in self._remote

    def adopt(self, worker_id: str, pid: int, local: bool) -> None:
        """Take worker ``worker_id`` (process ``pid``; ``local``: on this machine)."""
        if local and runs_worker(pid, worker_id):
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                self._on_gone(worker_id)  # gone between the two looks
                return
            self._local[worker_id] = pid
            spawn(f"adopted-{worker_id}", self._watch, worker_id, pidfd)
            return
        if local:
            log.info("adopted worker %s (pid %d) is no longer running", worker_id, pid)
            self._on_gone(worker_id)
            return
        self._remote.add(worker_id)

    def _watch(self, worker_id: str, pidfd: int) -> None:
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            while not poller.poll(1000):
                pass
        finally:
            os.close(pidfd)
        self._on_gone(worker_id)

    def pid(self, worker_id: str) -> int | None:
        return self._local.get(worker_id)

    def lapsed(self, worker_id: str) -> bool:
        """The registration of ``worker_id`` vanished: for a worker on another host
        (nothing else to watch) that is its death, reported at once. True then."""
        if worker_id in self._remote:
            self._remote.discard(worker_id)
            self._on_gone(worker_id)
            return True
        return False

    def _signal(self, worker_id: str, sig: int) -> bool:
        pid = self._local.get(worker_id)
        if pid is None or not runs_worker(pid, worker_id):
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        return True

    def kill(self, worker_id: str) -> None:
        """SIGKILL it (on this machine); one on another host is given up at once."""
        if not self._signal(worker_id, signal.SIGKILL):
            self._give_up(worker_id)

    def stop(self, worker_id: str) -> None:
        """SIGTERM, then SIGKILL after ``STOP_GRACE`` (in a helper thread); one on
        another host is given up at once."""
        if not self._signal(worker_id, signal.SIGTERM):
            self._give_up(worker_id)
            return

        def escalate() -> None:
            deadline = time.monotonic() + STOP_GRACE
            while time.monotonic() < deadline:
                if not runs_worker(self._local.get(worker_id, 0), worker_id):
                    return
                time.sleep(0.05)  # polling /proc with a deadline (not our child)
            self._signal(worker_id, signal.SIGKILL)

        spawn(f"stop-adopted-{worker_id}", escalate)

    def stop_all(self, worker_ids: list[str]) -> None:
        """Stop these adopted workers and wait (up to ``STOP_GRACE`` and a bit) until
        those on this machine are gone (the job's end)."""
        mine = [w for w in worker_ids if w in self]
        for worker_id in mine:
            self._signal(worker_id, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline and any(
            runs_worker(self._local[w], w) for w in mine if w in self._local
        ):
            time.sleep(0.05)  # polling /proc with a deadline (not our children)
        for worker_id in mine:
            self._signal(worker_id, signal.SIGKILL)

    def _give_up(self, worker_id: str) -> None:
        with self._lock:
            known = worker_id in self._remote or worker_id in self._local
            self._remote.discard(worker_id)
            self._local.pop(worker_id, None)
        if known:
            self._on_gone(worker_id)
