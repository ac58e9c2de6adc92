"""The worker processes of one job: start one, follow its exit, stop or kill it, reap all.

The main loop (``driver.job.loop``) keeps each worker's record (``driver.policy.lifecycle``), the
facts the rules decide on; this class keeps the other half, the process behind each
record, and does the I/O on it. It is given what it uses (the launcher, and a callback
for an exit), so it knows nothing of the loop, the records or the rules: the loop asks
it to act once a rule has decided. With ``elastic-run``'s own launcher
(``driver.launch.assignments.launcher.AgentLauncher``) a host's processes go through its
agent: the launch writes an assignment, the exit comes from the agent's status record,
and a kill or a stop rewrites the assignment; this class sees the same process handle
either way.
"""

from __future__ import annotations

import os
import signal
from typing import Callable

from driver.job.wiring import worker_id_for
from driver.launch.base import Launcher
from driver.launch.process import STOP_GRACE, WorkerProcess, stop_all
from driver.launch.spec import LaunchSpec
from driver.leadership.adopted_pids import AdoptedProcesses
from driver.threads import spawn
from rendezvous import env
from rendezvous.schema.rounds import Plan


class WorkerProcesses:
    """The processes of the workers ``launcher`` started, by worker id.

    ``on_exit(worker_id, code)`` is called from a helper thread when a process exits
    (``code`` -1 when the launcher could not tell).
    """

    def __init__(self, launcher: Launcher, on_exit: Callable[[str, int], None]):
        self._launcher = launcher
        self._on_exit = on_exit
        self._processes: dict[str, WorkerProcess] = {}
        self._launched = 0

    def new_id(self, host: str, slot: int | str) -> str:
        """A worker id for the next launch on ``host``'s ``slot`` (a spare's: ``sI``),
        unique in the job."""
        self._launched += 1
        return worker_id_for(host, slot, self._launched)

    @property
    def launched(self) -> int:
        """How many worker ids were made (the sequence a successor goes on from)."""
        return self._launched

    def continue_ids_after(self, launched: int) -> None:
        """Make ids after ``launched`` (a driver taking over goes on with the job's ids)."""
        self._launched = max(self._launched, launched)

    def start(self, worker_id: str, spec: LaunchSpec) -> int:
        """Start the worker ``spec`` describes, and follow its exit. Returns its pid.

        Raises:
            LauncherError: it cannot be started (``LaunchError.permanent``: no try will).
        """
        process = self._launcher.launch(spec)
        self._processes[worker_id] = process
        spawn(f"wait-{worker_id}", self._wait_exit, worker_id, process)
        return process.pid

    def adopt(self, worker_id: str, process: WorkerProcess) -> None:
        """Take ``process`` (launched by a driver that led the job before, and handed
        over by its agent's records) as this worker's, and follow its exit."""
        self._processes[worker_id] = process
        spawn(f"wait-{worker_id}", self._wait_exit, worker_id, process)

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._processes

    def _wait_exit(self, worker_id: str, process: WorkerProcess) -> None:
        code = process.wait(timeout=None)
        self._on_exit(worker_id, code if code is not None else -1)

    def pid(self, worker_id: str) -> int:
        return self._processes[worker_id].pid

    def assign_ranks(self, plan: Plan) -> None:
        """Prefix each process's output with its rank in ``plan`` (none outside it)."""
        for worker_id, process in self._processes.items():
            member = plan.member(worker_id)
            process.rank = member.rank if member is not None else None

    def kill(self, worker_id: str) -> None:
        """SIGKILL the worker (over ssh, its remote side too)."""
        self._processes[worker_id].kill()

    def stop(self, worker_id: str) -> None:
        """Stop the worker (SIGKILL after ``STOP_GRACE``) in a helper thread; its exit is
        reported like any other."""
        spawn(f"stop-{worker_id}", self._processes[worker_id].stop, STOP_GRACE)

    def stop_all(self, worker_ids: list[str]) -> None:
        """Stop these workers together and wait until they are gone (the job's end)."""
        stop_all([self._processes[worker_id] for worker_id in worker_ids], STOP_GRACE)


class HeldWorkers:
    """The job's workers, whichever holds each: a process this driver started or was
    handed (``processes``), or a worker adopted by its pid alone (``adopted``,
    ``driver.leadership.adopted_pids``). A stop or a kill goes to the one that holds it."""

    def __init__(self, processes: WorkerProcesses, adopted: AdoptedProcesses):
        self.processes = processes
        self.adopted = adopted

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self.processes or worker_id in self.adopted

    def kill(self, worker_id: str) -> None:
        """SIGKILL the worker."""
        (self.adopted if worker_id in self.adopted else self.processes).kill(worker_id)

    def stop(self, worker_id: str) -> None:
        """Stop the worker (SIGKILL after a grace); its exit is reported like any other."""
        (self.adopted if worker_id in self.adopted else self.processes).stop(worker_id)

    def pid(self, worker_id: str) -> int:
        """The worker's pid (an adopted one's, when known here)."""
        adopted = self.adopted.pid(worker_id) if worker_id in self.adopted else None
        return adopted or self.processes.pid(worker_id)

    def stop_all(self, worker_ids: list[str]) -> None:
        """Stop these workers together and wait until they are gone (the job's end)."""
        self.adopted.stop_all([w for w in worker_ids if w in self.adopted])
        self.processes.stop_all([w for w in worker_ids if w not in self.adopted])


def ask_stacks(worker_id: str, pid: int) -> bool:
    """Send SIGUSR1 to worker ``worker_id``'s process ``pid`` (its registration's), which
    then prints every thread's stack on its stderr (``elastic.hangs.watchdog``), when
    that process runs on this machine: only a process whose environment names the
    worker (``ELASTIC_WORKER_ID``) is signalled, so a pid of another host (or one the
    kernel gave again) is never hit. Returns whether it was sent."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:  # not here, gone, or not ours
        return False
    if f"{env.ENV_WORKER_ID}={worker_id}".encode() not in environ:
        return False
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError:
        return False
    return True
