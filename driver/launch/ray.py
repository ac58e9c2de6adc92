"""The ``ray`` launcher (``elastic-run --ray ADDRESS``): every process on its Ray node
through a local ``python -m driver.programs.ray_step`` (an actor pinned to the node runs it
as an ordinary process: see that module), as ``ssh`` runs one through the ssh client.

Hosts are node addresses (``driver.hosts.ray``). The local process carries the remote
one's output and status; SIGTERM to it reaches the remote process group; SIGKILL to it
ends its Ray job, and with it the actor and the process.
"""

from __future__ import annotations

import os
import subprocess
import sys

from driver.launch.base import Launcher
from driver.launch.output import PrefixFn, Stream
from driver.launch.process import WorkerProcess, start_process
from driver.launch.spec import LaunchSpec


def ray_step_argv(address: str, spec: LaunchSpec, cwd: str) -> list[str]:
    """The local command that runs ``spec`` on the node whose address is ``spec.host``."""
    return [
        sys.executable,
        "-m",
        "driver.programs.ray_step",
        address,
        spec.host,
        cwd,
        *spec.command,
    ]


class RayLauncher(Launcher):
    """Runs every process on the Ray node named by its host (module docstring)."""

    name = "ray"

    def __init__(self, address: str, out: Stream | None = None, err: Stream | None = None):
        super().__init__(out, err)
        self.address = address

    def launch(self, spec: LaunchSpec, prefix: PrefixFn | None = None) -> WorkerProcess:
        """See ``Launcher.launch``."""
        cwd = spec.cwd or os.getcwd()
        environ = {**os.environ, **spec.env}
        argv = ray_step_argv(self.address, spec, cwd)
        popen = start_process(argv, spec, environ, None, subprocess.DEVNULL)
        proc = WorkerProcess(spec, popen)
        proc.forward_output(prefix, self.out, self.err)
        return proc
