"""Where the job's hosts come from: the ``HostDiscovery`` interface every source of hosts
implements, and the settings sources are made from (``DiscoverySettings``).

A source answers one question, ``find_hosts()``: the hosts available now, in its order.
The job asks once at its start (an error there is fatal) and then, for a source that can
change, every ``--discovery-interval`` seconds (an error is then logged and retried:
``driver.job.feeds``); what the answers mean for the job (the host manager, the
blacklist) is not the source's business. The sources, by name: ``driver.hosts.registry``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from driver.hosts.slots import HostSlots

DEFAULT_SCRIPT_TIMEOUT = 30.0
"""Seconds a discovery script (or a scheduler's command) may run (``--discovery-timeout``):
cloud inventory calls can be slow; a hang must still end."""


class HostDiscovery(ABC):
    """Where the job's hosts come from."""

    @abstractmethod
    def find_hosts(self) -> tuple[HostSlots, ...]:
        """The hosts available now, in the source's order.

        Raises:
            DiscoveryError: the source cannot say (the message names it and why).
        """

    def cancel(self) -> None:  # noqa: B027 (most sources run no program: nothing to do)
        """The job ends (thread-safe): stop any program ``find_hosts`` runs now, and
        run none later."""

    def close(self) -> None:  # noqa: B027 (most sources hold nothing: nothing to do)
        """The job is over and no ``find_hosts`` runs any more: let go of what the
        source holds (a connection to a cluster). The driver ends without the
        interpreter's exit hooks (``rendezvous.process_exit``): this is their place."""


@dataclass(frozen=True)
class DiscoverySettings:
    """What the sources are made from: the fixed ``hosts``, the discovery ``script``
    ("" for none) and its ``timeout``, the slots of a host listed without any, in join
    mode ``read_agents`` (the job's agent records, read from its store), and whether
    the hosts are the Slurm allocation's nodes."""

    hosts: tuple[HostSlots, ...] = ()
    script: str = ""
    default_slots: int = 1
    timeout: float = DEFAULT_SCRIPT_TIMEOUT
    read_agents: Callable[[], Sequence[bytes]] | None = None
    allocation: bool = False  # the Slurm allocation's nodes (``--launcher slurm``)
    slurm_slots: int | None = None  # their slots (a Ray cluster's too), when given
    ray_address: str = ""  # the Ray cluster whose nodes are the hosts (``--ray``)
