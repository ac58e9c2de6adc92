"""The ``local`` launcher: every process a child of this one, on this machine."""

from __future__ import annotations

import os
import subprocess

from driver.launch.base import Launcher
from driver.launch.output import PrefixFn
from driver.launch.process import WorkerProcess, start_process
from driver.launch.spec import LaunchSpec


class LocalLauncher(Launcher):
    """Runs every process on this machine, whatever its host name (handy to simulate
    hosts in tests)."""

    name = "local"

    def launch(self, spec: LaunchSpec, prefix: PrefixFn | None = None) -> WorkerProcess:
        """See ``Launcher.launch``."""
        environ = {**os.environ, **spec.env}
        popen = start_process(list(spec.command), spec, environ, spec.cwd, subprocess.DEVNULL)
        proc = WorkerProcess(spec, popen)
        proc.forward_output(prefix, self.out, self.err)
        return proc
