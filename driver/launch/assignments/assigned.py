"""A process an agent runs for the driver, as the driver holds it (``AssignedProcess``):
a ``WorkerProcess`` whose pid and exit come from the agent's status records and whose
signals are asked for through the store (``driver.launch.assignments.launcher`` makes and follows them).
"""

from __future__ import annotations

import threading
from typing import Callable

from driver.launch.process import REAP_TIMEOUT, STOP_GRACE, WorkerProcess
from driver.launch.spec import LaunchSpec


class AssignedProcess(WorkerProcess):
    """A process an agent runs for the driver. No local process stands behind it: the
    pid is the agent's report (a pid on the agent's host), the exit code comes from the
    agent's status record, and signals are asked for by rewriting the assignment."""

    def __init__(self, spec: LaunchSpec, process_id: str, want: Callable[[str, str, float], None]):
        # Not WorkerProcess.__init__: there is no Popen here.
        self.spec = spec
        self.id = process_id
        self.rank: int | None = None
        self.forwarder = None
        self._want = want
        self._pid = 0
        self._code: int | None = None
        self.error = ""
        self.permanent = False
        self._presumed = False  # the exit was presumed, not reported
        self._reported = threading.Condition()

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._code

    def started(self, pid: int) -> None:
        with self._reported:
            self._pid = pid
            self._reported.notify_all()

    def ended(
        self, code: int, error: str = "", permanent: bool = False, presumed: bool = False
    ) -> None:
        """Its exit: from the agent's report, or ``presumed`` (-SIGKILL when its agent
        was lost: the process may still run on a host cut off, and is killed by its
        agent when that agent hears from the store again). The first one counts."""
        with self._reported:
            if self._code is None:
                self._code, self.error, self.permanent = code, error, permanent
                self._presumed = presumed
            self._reported.notify_all()

    def wait_reported(self, timeout: float) -> bool:
        """Wait until the agent said the process started or ended."""
        with self._reported:
            return self._reported.wait_for(
                lambda: bool(self._pid) or self._code is not None, timeout
            )

    def poll(self) -> int | None:
        return self._code

    def wait(self, timeout: float | None) -> int | None:
        with self._reported:
            self._reported.wait_for(lambda: self._code is not None, timeout)
            return self._code

    def terminate(self, grace: float = STOP_GRACE) -> None:
        if self._code is None:
            self._want(self.id, "stop", grace)

    def kill(self) -> None:
        if self._code is None or self._presumed:
            self._want(self.id, "kill", 0.0)

    def stop(self, grace: float = STOP_GRACE) -> int | None:
        """Ask the agent to stop it (SIGTERM, SIGKILL after its own grace); SIGKILL when
        no exit is reported within ``grace`` and a few seconds."""
        if self._code is None:
            self.terminate(grace)
            if self.wait(grace + REAP_TIMEOUT) is None:
                self.kill()
        return self.wait(REAP_TIMEOUT)

    def join_output(self, timeout: float) -> bool:
        return True  # the agent forwards it

    def __del__(self):
        pass
