"""The launchers: ``launch(spec)`` starts one process, locally or over ssh.

``get_launcher(name, ...)`` returns a ``Launcher`` for one of ``LAUNCHER_NAMES``
(``--launcher``); ``launcher.launch(spec)`` starts the process of ``spec`` and returns
a ``WorkerProcess`` whose output is forwarded, prefixed, to the driver's stdout and
stderr. Workers and ps shards are launched the same way: what the driver needs to know
from a process (its registration, a shard's readiness) comes through the store.
"""

from __future__ import annotations

import abc
import os
import subprocess
from typing import Callable

from driver.discovery import is_local_host
from driver.errors import UnknownLauncherError
from driver.launch.output import PrefixFn, Stream
from driver.launch.process import SSHWorkerProcess, WorkerProcess, start_process
from driver.launch.spec import LaunchSpec, SSHSettings
from driver.launch.ssh_wrapper import (
    encode_env_block,
    remote_environment,
    ssh_argv,
    ssh_remote_command,
)

LAUNCHER_NAMES = ("auto", "local", "ssh")
"""The launchers ``get_launcher`` knows, as ``--launcher`` offers them (default first)."""


class Launcher(abc.ABC):
    """Starts processes. ``out``/``err`` are where their output goes (default: the
    driver's ``sys.stdout``/``sys.stderr`` at the time of each line)."""

    name = "abstract"

    def __init__(self, out: Stream | None = None, err: Stream | None = None):
        self.out = out
        self.err = err

    @abc.abstractmethod
    def launch(self, spec: LaunchSpec, prefix: PrefixFn | None = None) -> WorkerProcess:
        """Start the process of ``spec``; its output is forwarded with ``prefix()``
        (default: ``[rank]`` from ``WorkerProcess.rank``, ``[label]`` before a rank).

        Raises:
            LaunchError: the process cannot be started.
            LaunchSpecError: a spec this launcher cannot run.
        """


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


class AutoLauncher(Launcher):
    """Local for hosts that name this machine, ssh for the others.

    ``is_local(host) -> bool`` decides (default: ``driver.discovery.is_local_host``)."""

    name = "auto"

    def __init__(
        self,
        settings: SSHSettings | None = None,
        out: Stream | None = None,
        err: Stream | None = None,
        is_local: Callable[[str], bool] | None = None,
    ):
        super().__init__(out, err)
        self.local = LocalLauncher(out, err)
        self.ssh = SSHLauncher(settings, out, err)
        self.is_local = is_local or is_local_host

    def launch(self, spec: LaunchSpec, prefix: PrefixFn | None = None) -> WorkerProcess:
        """See ``Launcher.launch``."""
        chosen = self.local if self.is_local(spec.host) else self.ssh
        return chosen.launch(spec, prefix)


def get_launcher(
    name: str,
    *,
    ssh_settings: SSHSettings | None = None,
    out: Stream | None = None,
    err: Stream | None = None,
    is_local: Callable[[str], bool] | None = None,
) -> Launcher:
    """The launcher called ``name`` (one of ``LAUNCHER_NAMES``).

    Raises:
        UnknownLauncherError: any other name.
    """
    if name == "local":
        return LocalLauncher(out, err)
    if name == "ssh":
        return SSHLauncher(ssh_settings, out, err)
    if name == "auto":
        return AutoLauncher(ssh_settings, out, err, is_local)
    raise UnknownLauncherError(
        f"unknown launcher {name!r} (choose from {', '.join(LAUNCHER_NAMES)})"
    )
