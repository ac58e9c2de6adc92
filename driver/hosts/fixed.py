"""The ``fixed`` source of hosts: a list that never changes (``-H``, or localhost)."""

from __future__ import annotations

from collections.abc import Sequence

from driver.hosts.discovery import HostDiscovery
from driver.hosts.slots import HostSlots


class FixedDiscovery(HostDiscovery):
    """A host list that never changes (``-H``, or localhost for a single-machine job)."""

    def __init__(self, hosts: Sequence[HostSlots]):
        self._hosts = tuple(hosts)

    def find_hosts(self) -> tuple[HostSlots, ...]:
        return self._hosts

    def __repr__(self) -> str:
        return f"FixedDiscovery({self._hosts!r})"
