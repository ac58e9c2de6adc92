"""The ``ssh`` launcher: every process through ``ssh HOST``, under the wrapper script of
``driver.launch.ssh_wrapper`` (its process group ends with the connection)."""

from __future__ import annotations

import os
import subprocess

from driver.launch.base import Launcher
from driver.launch.output import PrefixFn, Stream
from driver.launch.process import SSHWorkerProcess, WorkerProcess, start_process
from driver.launch.spec import LaunchSpec, SSHSettings
from driver.launch.ssh_wrapper import (
    encode_env_block,
    remote_environment,
    ssh_argv,
    ssh_remote_command,
)


class SSHLauncher(Launcher):
    """Runs every process through ``ssh HOST`` with ``settings``."""

    name = "ssh"

    def __init__(
        self,
        settings: SSHSettings | None = None,
        out: Stream | None = None,
        err: Stream | None = None,
    ):
        super().__init__(out, err)
        self.settings = settings or SSHSettings()

    def launch(self, spec: LaunchSpec, prefix: PrefixFn | None = None) -> WorkerProcess:
        """See ``Launcher.launch``."""
        cwd = spec.cwd or os.getcwd()
        argv = ssh_argv(spec.host, ssh_remote_command(spec, cwd, self.settings), self.settings)
        env_block = encode_env_block(remote_environment(spec.env, os.environ, self.settings))
        # ssh itself runs with the driver's environment (HOME, SSH_AUTH_SOCK) and cwd.
        popen = start_process(argv, spec, os.environ, None, subprocess.PIPE)
        proc = SSHWorkerProcess(spec, popen, env_block)
        proc.forward_output(prefix, self.out, self.err)
        return proc
