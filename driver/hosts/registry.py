"""The sources of a job's hosts, by name: ``make_discovery(name, settings)``.

Each source registers in ``SOURCES`` with a creator that imports its module only when
it is chosen:

* ``fixed`` (``driver.hosts.fixed``): a list that never changes: ``-H``, or localhost;
* ``script`` (``driver.hosts.script``): the user's ``--host-discovery-script``;
* ``joined`` (``driver.hosts.joined``): the nodes that joined the job (``--join``),
  and those of ``-H`` or a script where given;
* ``slurm`` (``driver.hosts.slurm``): the usable nodes of the Slurm allocation the
  driver runs in (``--launcher slurm`` without -H or a script);
* ``ray`` (``driver.hosts.ray``): the alive nodes of a Ray cluster (``--ray ADDRESS``).

A new source (a scheduler's allocation, a cluster's live nodes, nodes that joined the
job) is a ``driver.hosts.discovery.HostDiscovery`` in a module of its own here, a
creator in ``SOURCES``, and the setting that picks it (``source_name``).
"""

from __future__ import annotations

import os
from typing import Callable

from driver.errors import UnknownDiscoveryError
from driver.hosts.discovery import DiscoverySettings, HostDiscovery


def _fixed(settings: DiscoverySettings) -> HostDiscovery:
    from driver.hosts.fixed import FixedDiscovery

    return FixedDiscovery(settings.hosts)


def _script(settings: DiscoverySettings) -> HostDiscovery:
    from driver.hosts.script import ScriptDiscovery

    return ScriptDiscovery(settings.script, settings.default_slots, settings.timeout)


def _joined(settings: DiscoverySettings) -> HostDiscovery:
    from driver.hosts.joined import JoinedDiscovery

    if settings.read_agents is None:
        raise UnknownDiscoveryError("the joined nodes need the job's store to be read from")
    # -H or a script beside the nodes: their hosts too (agents started by ssh)
    also = _script(settings) if settings.script else _fixed(settings) if settings.hosts else None
    return JoinedDiscovery(settings.read_agents, also)


def _slurm(settings: DiscoverySettings) -> HostDiscovery:
    from driver.hosts.slurm import SlurmDiscovery

    return SlurmDiscovery(os.environ, settings.slurm_slots, settings.timeout)


def _ray(settings: DiscoverySettings) -> HostDiscovery:
    from driver.hosts.ray import RayDiscovery

    return RayDiscovery(settings.ray_address, settings.slurm_slots)


SOURCES: dict[str, Callable[[DiscoverySettings], HostDiscovery]] = {
    "fixed": _fixed,
    "script": _script,
    "joined": _joined,
    "slurm": _slurm,
    "ray": _ray,
}
"""The sources of hosts by name, each with its creator."""


def source_name(settings: DiscoverySettings) -> str:
    """The source the settings ask for: ``joined`` in join mode, ``slurm`` for the
    allocation's nodes, ``ray`` for a Ray cluster's, ``script`` when a script is given,
    else ``fixed``."""
    if settings.read_agents is not None:
        return "joined"
    if settings.allocation:
        return "slurm"
    if settings.ray_address:
        return "ray"
    return "script" if settings.script else "fixed"


def make_discovery(name: str, settings: DiscoverySettings) -> HostDiscovery:
    """The source called ``name`` (one of ``SOURCES``), made from ``settings``.

    Raises:
        UnknownDiscoveryError: any other name.
    """
    try:
        creator = SOURCES[name]
    except KeyError:
        raise UnknownDiscoveryError(
            f"unknown host discovery {name!r} (choose from {', '.join(SOURCES)})"
        ) from None
    return creator(settings)
