"""The events of the hosts: added, removed, resized, blacklisted, kept, back, cut off,
preempted; and a failed discovery run.

``driver.hosts.manager.HostManager`` makes the ``HostEvent``s as its answers to changes; the
driver's probe of a silent host makes ``HostUnreachable``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from driver.events.base import Event, plural


@dataclass(frozen=True)
class HostEvent(Event):
    """Something that changed about a host (``driver.hosts.manager.HostManager`` makes these)."""

    host: str


@dataclass(frozen=True)
class HostAdded(HostEvent):
    kind: ClassVar[str] = "host_added"
    slots: int

    def __str__(self) -> str:
        return f"host {self.host} added with {self.slots} slot(s)"


@dataclass(frozen=True)
class HostRemoved(HostEvent):
    kind: ClassVar[str] = "host_removed"
    slots: int

    def __str__(self) -> str:
        return f"host {self.host} removed (had {self.slots} slot(s))"


@dataclass(frozen=True)
class HostSlotsChanged(HostEvent):
    kind: ClassVar[str] = "host_slots_changed"
    old_slots: int
    new_slots: int

    def __str__(self) -> str:
        return f"host {self.host} now has {self.new_slots} slot(s) (was {self.old_slots})"


@dataclass(frozen=True)
class HostBlacklisted(HostEvent):
    """``failures`` worker failures within the window; out until ``until`` (on the
    driver's monotonic clock) for ``cooldown`` seconds, its ``strikes``-th time."""

    kind: ClassVar[str] = "host_blacklisted"
    failures: int
    strikes: int
    cooldown: float
    until: float

    def __str__(self) -> str:
        return (
            f"host {self.host} blacklisted for {self.cooldown:g} s after {self.failures} "
            f"worker failure(s) (strike {self.strikes})"
        )


@dataclass(frozen=True)
class HostUnreachable(HostEvent):
    """Peers stopped hearing from a worker on ``host`` and the host did not answer a
    connection attempt either (``detail``): it is cut off or down, with all its workers."""

    kind: ClassVar[str] = "host_unreachable"
    detail: str
    workers: list[str]

    def __str__(self) -> str:
        return (
            f"host {self.host} is unreachable ({self.detail}): dropping its workers "
            f"{', '.join(self.workers) or '(none)'}"
        )


@dataclass(frozen=True)
class HostPreempted(HostEvent):
    """The agent of ``host`` got SIGTERM (the scheduler takes the host back): its
    ``workers`` leave at their next commit while members on other hosts go on with the
    state (``handover``), or stop once a snapshot of the newest commit is written
    (``snapshot``), or at once when there is nothing to write one to."""

    kind: ClassVar[str] = "host_preempted"
    workers: list[str]
    snapshot: bool
    handover: bool = False

    def __str__(self) -> str:
        who = ", ".join(self.workers) or "(none)"
        if self.handover:
            return (
                f"host {self.host} is being drained: its workers leave at their next "
                f"commit, the others go on: {who}"
            )
        first = "after a snapshot of the state, " if self.snapshot else ""
        return f"host {self.host} is being preempted: {first}its workers stop: {who}"


@dataclass(frozen=True)
class HostBlacklistSkipped(HostEvent):
    """The host met the blacklisting rule but is kept: without it fewer than ``min_np``
    slots would remain (``remaining_slots``)."""

    kind: ClassVar[str] = "host_blacklist_skipped"
    failures: int
    remaining_slots: int
    min_np: int

    def __str__(self) -> str:
        return (
            f"host {self.host} kept despite {self.failures} worker failure(s): without it "
            f"{self.remaining_slots} slot(s) would remain, fewer than min_np {self.min_np}"
        )


@dataclass(frozen=True)
class HostReturned(HostEvent):
    """The host's cooldown ended; it is usable again (if discovery still lists it)."""

    kind: ClassVar[str] = "host_back"

    def __str__(self) -> str:
        return f"host {self.host} back from the blacklist"


@dataclass(frozen=True)
class HostDiscoveryFailed(Event):
    """A discovery run after the first failed (it is retried at the next interval)."""

    kind: ClassVar[str] = "discovery_error"
    error: str
    again: int = 0  # runs that failed the same way since it was last said

    def __str__(self) -> str:
        repeated = f" ({plural(self.again, 'more failed run')} since it was last said)"
        return f"host discovery failed: {self.error}" + (repeated if self.again else "")
