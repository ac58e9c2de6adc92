"""How a host's processes are started, by name: the launchers ``--launcher`` offers.

Each launcher registers in ``LAUNCHERS`` with a creator that imports its module only
when it is chosen (``--help`` and the flags never load ssh or the agents' machinery):

* ``auto`` (``driver.launch.auto``, the default): locally on this machine, over ssh
  elsewhere;
* ``local`` (``driver.launch.local``): every process on this machine, whatever its
  host's name (the names are labels);
* ``ssh`` (``driver.launch.ssh``): every process through ``ssh HOST``;
* ``slurm`` (``driver.launch.srun``): every process as a one-task step of the Slurm
  allocation the driver runs in (``srun --overlap --no-kill -w HOST``); the hosts are
  then the allocation's nodes (``driver.hosts.slurm``) unless -H or a script says;
* ``ray`` (``driver.launch.ray``): every process on its Ray node through an actor pinned
  there (``--ray ADDRESS`` picks it, with the cluster's nodes as the hosts).

A new way to start a host's processes (a scheduler's step launcher, a cluster's actor)
is a ``driver.launch.base.Launcher`` in a module of its own here and a creator in
``LAUNCHERS``; ``--launcher`` offers it from then on. ``elastic-run`` puts the chosen
launcher behind the per-host agents (``driver.launch.assignments``) where a host needs one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from driver.errors import UnknownLauncherError
from driver.launch.output import Stream
from driver.launch.spec import SSHSettings

if TYPE_CHECKING:
    from driver.launch.base import Launcher


@dataclass(frozen=True)
class LauncherOptions:
    """What a launcher is made from: the ssh settings, where the processes' output goes
    (``out``/``err``; None: the driver's stdout/stderr at each line), and the rule that
    tells this machine's hosts (``is_local``; None: ``rendezvous.net.addresses.is_local_host``)."""

    ssh_settings: SSHSettings = field(default_factory=SSHSettings)
    out: Stream | None = None
    err: Stream | None = None
    is_local: Callable[[str], bool] | None = None
    ray_address: str = ""  # the cluster of the ``ray`` launcher


def _auto(options: LauncherOptions) -> Launcher:
    from driver.launch.auto import AutoLauncher

    return AutoLauncher(options.ssh_settings, options.out, options.err, options.is_local)


def _local(options: LauncherOptions) -> Launcher:
    from driver.launch.local import LocalLauncher

    return LocalLauncher(options.out, options.err)


def _ssh(options: LauncherOptions) -> Launcher:
    from driver.launch.ssh import SSHLauncher

    return SSHLauncher(options.ssh_settings, options.out, options.err)


def _slurm(options: LauncherOptions) -> Launcher:
    from driver.launch.srun import SrunLauncher

    return SrunLauncher(options.out, options.err)


def _ray(options: LauncherOptions) -> Launcher:
    from driver.launch.ray import RayLauncher

    return RayLauncher(options.ray_address, options.out, options.err)


LAUNCHERS: dict[str, Callable[[LauncherOptions], Launcher]] = {
    "auto": _auto,
    "local": _local,
    "ssh": _ssh,
    "slurm": _slurm,
    "ray": _ray,
}
"""The launchers by name, each with its creator; ``--launcher`` offers them in this
order (the first is its default)."""


def launcher_names() -> tuple[str, ...]:
    """The names ``get_launcher`` knows, default first."""
    return tuple(LAUNCHERS)


def get_launcher(
    name: str,
    *,
    ssh_settings: SSHSettings | None = None,
    out: Stream | None = None,
    err: Stream | None = None,
    is_local: Callable[[str], bool] | None = None,
    ray_address: str = "",
) -> Launcher:
    """The launcher called ``name`` (one of ``LAUNCHERS``).

    Raises:
        UnknownLauncherError: any other name.
    """
    try:
        creator = LAUNCHERS[name]
    except KeyError:
        raise UnknownLauncherError(
            f"unknown launcher {name!r} (choose from {', '.join(LAUNCHERS)})"
        ) from None
    return creator(LauncherOptions(ssh_settings or SSHSettings(), out, err, is_local, ray_address))
