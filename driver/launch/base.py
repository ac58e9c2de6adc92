"""The ``Launcher`` interface: ``launch(spec)`` starts one process on its host.

Workers, ps shards and the per-host agents are all started through it, with the one
signature: what the driver needs to know from a process (its registration, a shard's
readiness) comes through the store, never from its output. The implementations, one
module each, are chosen by name in ``driver.launch.registry``.
"""

from __future__ import annotations

import abc

from driver.launch.output import PrefixFn, Stream
from driver.launch.process import WorkerProcess
from driver.launch.spec import LaunchSpec


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
