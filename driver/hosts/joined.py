"""The ``joined`` source of hosts: the nodes that joined the job (``elastic-run --join``).

A joined node runs its host's agent, whose record (under the agent's own lease) says the
slots the node offers; the hosts are the nodes whose record is there now, in the order
they joined. A node that leaves (its agent exits, or its lease lapses: the node is lost)
is gone from the next answer. Hosts listed by ``-H`` or a discovery script as well
(``also``) come after the nodes; a host that is both is the node's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from driver.errors import DiscoveryError
from driver.hosts.discovery import HostDiscovery
from driver.hosts.slots import HostSlots
from rendezvous.errors import RendezvousError
from rendezvous.schema.agents import AgentRecord

log = logging.getLogger(__name__)


class JoinedDiscovery(HostDiscovery):
    """The joined nodes: ``read_agents()`` gives the values of the job's agent records
    (``JobKeys.agents``) as the store holds them now."""

    def __init__(
        self, read_agents: Callable[[], Sequence[bytes]], also: HostDiscovery | None = None
    ):
        self._read_agents = read_agents
        self._also = also

    def find_hosts(self) -> tuple[HostSlots, ...]:
        """Raises ``DiscoveryError`` when the store cannot be read, or ``also`` fails."""
        try:
            values = self._read_agents()
        except RendezvousError as exc:
            raise DiscoveryError(f"cannot read the joined nodes from the store: {exc}") from None
        nodes = joined_hosts(values)
        if self._also is None:
            return nodes
        names = {h.host for h in nodes}
        return nodes + tuple(h for h in self._also.find_hosts() if h.host not in names)

    def cancel(self) -> None:
        if self._also is not None:
            self._also.cancel()

    def __repr__(self) -> str:
        return f"JoinedDiscovery(also={self._also!r})"


def joined_hosts(values: Sequence[bytes]) -> tuple[HostSlots, ...]:
    """The hosts of the agent records ``values`` that joined (slots > 0) and are not
    draining, first joined first; an unreadable record is logged and left out."""
    records = []
    for value in values:
        try:
            record = AgentRecord.from_json(value)
        except (ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable agent record: %s", exc)
            continue
        if record.slots > 0 and not record.draining:
            records.append(record)
    records.sort(key=lambda r: (r.started, r.host))
    return tuple(HostSlots(r.host, r.slots) for r in records)
