"""The ``auto`` launcher (``--launcher``'s default): this machine's processes started
locally, every other host's over ssh."""

from __future__ import annotations

from typing import Callable

from driver.launch.base import Launcher
from driver.launch.local import LocalLauncher
from driver.launch.output import PrefixFn, Stream
from driver.launch.process import WorkerProcess
from driver.launch.spec import LaunchSpec, SSHSettings
from driver.launch.ssh import SSHLauncher
from rendezvous.net.addresses import is_local_host


class AutoLauncher(Launcher):
    """Local for hosts that name this machine, ssh for the others.

    ``is_local(host) -> bool`` decides (default: ``rendezvous.net.addresses.is_local_host``)."""

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
