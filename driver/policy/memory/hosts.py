"""What the host rules remember: the source of hosts listing none or failing
(``driver.policy.reports``), hosts being drained (``driver.policy.preemption``) and the
workers that leave with them (``driver.policy.departures``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple


class DiscoveryError(NamedTuple):
    """The last discovery error said, when, and how many failed runs went unsaid since
    (``policy.reports.discovery_failed``)."""

    error: str
    said_at: float
    unsaid: int


class Drain(NamedTuple):
    """``host`` is being preempted: its workers stop once the snapshot of round
    ``round_id`` is complete, or at ``until``."""

    host: str
    round_id: int
    until: float


class Departure(NamedTuple):
    """``worker_id`` (a drained host's) leaves at its next commit (``Leave``), stopped if
    still running at ``until``."""

    worker_id: str
    until: float


@dataclass(frozen=True)
class HostBook:
    """The host rules' memory; replaced, never changed.

    ``no_hosts_since``/``no_hosts_said_at``: since when discovery lists no host, and when
    that was last said. ``discovery_error``: the last discovery error said (None: the
    last run succeeded). ``draining``: hosts being preempted, waiting for the snapshot
    their workers stop after. ``leaving``: workers that leave at their next commit."""

    no_hosts_since: float | None = None
    no_hosts_said_at: float | None = None
    discovery_error: DiscoveryError | None = None
    draining: tuple[Drain, ...] = ()
    leaving: tuple[Departure, ...] = ()

    def leaves(self, worker_id: str, until: float) -> HostBook:
        """``worker_id`` leaves at its next commit, stopped if still running at ``until``."""
        return replace(self, leaving=(*self.leaving, Departure(worker_id, until)))

    def leaving_ids(self) -> set[str]:
        """The workers that leave at their next commit."""
        return {d.worker_id for d in self.leaving}
