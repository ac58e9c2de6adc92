"""The host manager: which hosts the job may use right now (pure).

Everything here is pure logic: no clocks, no sockets, no processes. Time is passed in
as ``now`` (seconds on any monotonic scale) so the rules can be tested exactly.

Rules (docs/DESIGN.md leaves them to us):

* Order. Hosts already known keep their old order; hosts new to the job follow
  (``driver.hosts.slots.order_hosts``).
* Blacklisting. A host is blacklisted when ``failure_threshold`` of its workers fail
  within ``failure_window`` seconds (one crash of one worker is usually the program or
  a transient; several in a short time is usually the machine). Its cooldown grows
  exponentially with each blacklisting ("strike") and is clamped into
  ``[cooldown_min, cooldown_max]``; when it ends the host is back. Strikes never decay,
  so a host that keeps failing stays out for the maximum cooldown each time.
* Protection. By default a host is never blacklisted when that would leave fewer than
  ``min_np`` slots on the usable hosts: a job that cannot shrink keeps its machines and
  replaces the dead workers instead (a one-machine job keeps its machine however often
  its workers die). A ``HostBlacklistSkipped`` event says so. (The host events are
  classes of the driver's event vocabulary, ``driver.events``.)
* Blacklist state is kept per host name even while discovery no longer lists the host,
  so a flapping host cannot escape its cooldown by vanishing and coming back.
* An empty result. Once the job has hosts, a discovery result that lists none changes
  nothing (``lists_none`` says it came): taken literally it would stop every worker, and
  the fresh workers of a later result would start training over, the committed state
  lost with the last worker that held it. An empty list mid-run is far more often a
  broken script or a cloud API's bad moment than a wish to drain every machine (to end
  a job, stop it). The job's rules say so while it lasts (``driver.policy.reports``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from driver.events import (
    HostAdded,
    HostBlacklisted,
    HostBlacklistSkipped,
    HostEvent,
    HostRemoved,
    HostReturned,
    HostSlotsChanged,
)
from driver.hosts.slots import (
    HostSlots,
    available_slots,
    diff_hosts,
    order_hosts,
    total_slots,
)


def cooldown_for(strikes: int, min_s: float, max_s: float) -> float:
    """Seconds a host stays blacklisted after its ``strikes``-th blacklisting (>= 1):
    ``min_s`` doubled for each earlier strike, clamped into ``[min_s, max_s]``."""
    if strikes < 1:
        raise ValueError(f"strikes must be >= 1, got {strikes}")
    if not 0 <= min_s <= max_s:
        raise ValueError(f"need 0 <= min_s <= max_s, got {min_s}, {max_s}")
    # Cap the exponent: 2**1100 overflows a float, and anything past 2**64 is clamped anyway.
    return min(max(min_s * 2.0 ** min(strikes - 1, 64), min_s), max_s)


@dataclass(frozen=True)
class BlacklistPolicy:
    """When a host is blacklisted and for how long (see the module docstring).

    Raises ``ValueError`` on construction if a value is out of range."""

    failure_threshold: int = 3  # worker failures on one host ...
    failure_window: float = 60.0  # ... within this many seconds blacklist it
    cooldown_min: float = 10.0
    cooldown_max: float = 300.0
    protect_min_np: bool = True  # never blacklist below min_np usable slots

    def __post_init__(self):
        if self.failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {self.failure_threshold}")
        if not self.failure_window > 0:
            raise ValueError(f"failure_window must be > 0, got {self.failure_window}")
        if not 0 <= self.cooldown_min <= self.cooldown_max:
            raise ValueError(
                f"need 0 <= cooldown_min <= cooldown_max, "
                f"got {self.cooldown_min}, {self.cooldown_max}"
            )


@dataclass
class _HostRecord:
    """Mutable per-host history; lives as long as the job, whether listed or not."""

    failure_times: deque = field(default_factory=deque)
    strikes: int = 0
    blacklisted_until: float | None = None


class HostManager:
    """The job's hosts: the latest discovery result in stable order, minus blacklisted ones.

    State changes only through ``update``, ``record_failure`` and ``release_expired``;
    each takes the current time and returns the events it caused, in order."""

    def __init__(self, policy: BlacklistPolicy, min_np: int, max_np: int | None = None):
        self._policy = policy
        self._min_np = min_np
        self._max_np = max_np
        self._hosts: tuple[HostSlots, ...] = ()  # discovered, in stable order
        self._records: dict[str, _HostRecord] = {}
        self._lists_none = True  # the latest result listed no host (none came yet)

    # -- queries

    @property
    def known_hosts(self) -> tuple[HostSlots, ...]:
        """Every host of the latest discovery result, blacklisted or not, in stable order."""
        return self._hosts

    @property
    def lists_none(self) -> bool:
        """True when the latest discovery result listed no host (or none came yet); the
        job may still have hosts: an empty result keeps them (module docstring)."""
        return self._lists_none

    @property
    def usable_hosts(self) -> tuple[HostSlots, ...]:
        """The hosts workers may run on now: known and not blacklisted, in stable order."""
        return tuple(h for h in self._hosts if not self.is_blacklisted(h.host))

    @property
    def blacklisted_hosts(self) -> tuple[str, ...]:
        """Hosts currently blacklisted (listed by discovery or not), by name."""
        return tuple(sorted(name for name in self._records if self.is_blacklisted(name)))

    def is_blacklisted(self, host: str) -> bool:
        record = self._records.get(host)
        return record is not None and record.blacklisted_until is not None

    def strikes(self, host: str) -> int:
        """How many times ``host`` has been blacklisted so far."""
        record = self._records.get(host)
        return record.strikes if record else 0

    @property
    def available_slots(self) -> int:
        """Workers the usable hosts can run at once, capped by max_np."""
        return available_slots(self.usable_hosts, self._max_np)

    @property
    def all_blacklisted(self) -> bool:
        """True when discovery lists hosts but every one of them is blacklisted."""
        return bool(self._hosts) and not self.usable_hosts

    def next_release_time(self) -> float | None:
        """The earliest end of a running cooldown (when to call ``release_expired``), or None."""
        ends = [
            r.blacklisted_until for r in self._records.values() if r.blacklisted_until is not None
        ]
        return min(ends) if ends else None

    # -- changes

    def update(self, discovered: Sequence[HostSlots], now: float) -> tuple[HostEvent, ...]:
        """Take a new discovery result (distinct hosts). Returns cooldowns that ended by
        ``now`` (``HostReturned``), then added, changed and removed hosts. An empty
        result keeps the hosts the job has (module docstring)."""
        events = list(self.release_expired(now))
        self._lists_none = not discovered
        if not discovered:
            return tuple(events)
        ordered = order_hosts([h.host for h in self._hosts], discovered)
        diff = diff_hosts(self._hosts, ordered)
        events += [HostAdded(h.host, h.slots) for h in diff.added]
        events += [HostSlotsChanged(name, old, new) for name, old, new in diff.changed]
        events += [HostRemoved(h.host, h.slots) for h in diff.removed]
        self._hosts = ordered
        return tuple(events)

    def keep_in_use(self, in_use: Sequence[HostSlots]) -> tuple[HostEvent, ...]:
        """Take ``in_use`` (the hosts the job's running workers are on) as the job's
        hosts when it has none while discovery lists none: a driver that takes a job
        over at such a moment must not drop what its workers run on (see the empty
        result in the module docstring). Otherwise nothing changes."""
        if self._hosts or not self._lists_none:
            return ()
        self._hosts = tuple(in_use)
        return tuple(HostAdded(h.host, h.slots) for h in self._hosts)

    def release_expired(self, now: float) -> tuple[HostEvent, ...]:
        """End the cooldowns that are over by ``now``; one ``HostReturned`` per host."""
        events = []
        for name, record in self._records.items():
            if record.blacklisted_until is not None and record.blacklisted_until <= now:
                record.blacklisted_until = None
                events.append(HostReturned(name))
        return tuple(events)

    def record_failure(self, host: str, now: float) -> tuple[HostEvent, ...]:
        """A worker on ``host`` failed at ``now``. May blacklist the host (or say why not).

        Failures of a host that is already blacklisted are not counted: its workers were
        started before it was blacklisted and are expected to go."""
        events = list(self.release_expired(now))
        record = self._records.setdefault(host, _HostRecord())
        if record.blacklisted_until is not None:
            return tuple(events)
        policy = self._policy
        record.failure_times.append(now)
        while record.failure_times and record.failure_times[0] <= now - policy.failure_window:
            record.failure_times.popleft()
        failures = len(record.failure_times)
        if failures < policy.failure_threshold:
            return tuple(events)
        # Either way the window starts afresh: a host that returns (or was kept) must
        # fail the full threshold again before the rule fires again.
        record.failure_times.clear()
        remaining = total_slots(h for h in self.usable_hosts if h.host != host)
        if policy.protect_min_np and remaining < self._min_np and self._is_listed(host):
            events.append(HostBlacklistSkipped(host, failures, remaining, self._min_np))
            return tuple(events)
        record.strikes += 1
        cooldown = cooldown_for(record.strikes, policy.cooldown_min, policy.cooldown_max)
        record.blacklisted_until = now + cooldown
        events.append(HostBlacklisted(host, failures, record.strikes, cooldown, now + cooldown))
        return tuple(events)

    def host_lost(self, host: str, now: float) -> tuple[HostEvent, ...]:
        """``host`` stopped answering at ``now`` (cut off or down): blacklist it at once,
        whatever the failure count and even below ``min_np`` (nothing can run on a host
        nobody reaches; the cooldown lets it come back through discovery)."""
        events = list(self.release_expired(now))
        record = self._records.setdefault(host, _HostRecord())
        if record.blacklisted_until is not None:
            return tuple(events)
        policy = self._policy
        record.failure_times.clear()
        record.strikes += 1
        cooldown = cooldown_for(record.strikes, policy.cooldown_min, policy.cooldown_max)
        record.blacklisted_until = now + cooldown
        events.append(HostBlacklisted(host, 0, record.strikes, cooldown, now + cooldown))
        return tuple(events)

    def cooldowns(self) -> tuple[tuple[str, int, float | None], ...]:
        """Every host's ``(host, strikes, blacklisted_until)`` with a strike or a running
        cooldown: what a successor driver needs to go on (``restore``)."""
        return tuple(
            (name, r.strikes, r.blacklisted_until)
            for name, r in sorted(self._records.items())
            if r.strikes or r.blacklisted_until is not None
        )

    def restore(self, host: str, strikes: int, until: float | None) -> None:
        """Take over ``host``'s strikes and cooldown end (``until``, in this manager's
        clock; None: not blacklisted) from a driver that led the job before."""
        record = self._records.setdefault(host, _HostRecord())
        record.strikes = max(record.strikes, strikes)
        record.blacklisted_until = until

    def _is_listed(self, host: str) -> bool:
        return any(h.host == host for h in self._hosts)
