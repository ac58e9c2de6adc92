"""The ``slurm`` launcher: every process as a one-task step of the Slurm allocation the
driver runs in, on its host (``srun --overlap --no-kill -N1 -n1 -w HOST``), so Slurm
accounts for each one, signals it when the job is cancelled or preempted, and cleans up
after it; no ssh anywhere.

``elastic-run`` runs the hosts' agents this way (``driver.launch.assignments``), and the agents
start the workers as their own children, as over ssh. The step gets the driver's
environment plus the spec's (``--export=ALL``: the job's secret travels in the
environment, never on a command line). A stop is a SIGTERM to ``srun``, which forwards
it to the task; a kill is two SIGINTs within a second, which has ``srun`` SIGKILL the
step's tasks (Slurm's own way to end a step at once), then SIGKILL to ``srun`` itself.
"""

from __future__ import annotations

import os
import signal
import subprocess

from driver.launch.base import Launcher
from driver.launch.output import PrefixFn
from driver.launch.process import WorkerProcess, start_process
from driver.launch.spec import LaunchSpec

KILL_CONFIRM = 1.0
"""Seconds ``srun`` has to end the step after its double SIGINT before it is SIGKILLed
itself."""


def srun_argv(spec: LaunchSpec, cwd: str) -> list[str]:
    """The ``srun`` command line of ``spec``: one task on ``spec.host``, beside the
    allocation's other steps (``--overlap``), kept when a node fails (``--no-kill``)."""
    return [
        "srun",
        "--overlap",
        "--no-kill",
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
        f"--nodelist={spec.host}",
        f"--chdir={cwd}",
        "--export=ALL",
        "--kill-on-bad-exit=0",
        "--quiet",
        f"--job-name=elastic-{spec.label}",
        *spec.command,
    ]


class SrunProcess(WorkerProcess):
    """A process run as a step through the local ``srun`` (module docstring)."""

    def terminate(self) -> None:
        """SIGTERM to ``srun``, which forwards it to the task."""
        if self.poll() is None:
            self._signal_srun(signal.SIGTERM)

    def kill(self) -> None:
        """Have ``srun`` SIGKILL the task (two SIGINTs), then SIGKILL ``srun``."""
        if self.poll() is None:
            self._signal_srun(signal.SIGINT)
            self._signal_srun(signal.SIGINT)
            if self.wait(KILL_CONFIRM) is None:
                self._signal_leader_group(signal.SIGKILL)

    def _signal_srun(self, sig: int) -> None:
        # srun alone: its group is ours, but a signal to the group would reach no task.
        with self._lock:
            if self._popen.returncode is None:
                os.kill(self.pid, sig)


class SrunLauncher(Launcher):
    """Runs every process as a one-task Slurm step on its host."""

    name = "slurm"

    def launch(self, spec: LaunchSpec, prefix: PrefixFn | None = None) -> WorkerProcess:
        """See ``Launcher.launch``."""
        cwd = spec.cwd or os.getcwd()
        environ = {**os.environ, **spec.env}
        popen = start_process(srun_argv(spec, cwd), spec, environ, None, subprocess.DEVNULL)
        proc = SrunProcess(spec, popen)
        proc.forward_output(prefix, self.out, self.err)
        return proc
