"""Hosts and their slots, and the host manager: which hosts the job may use right now.

Everything here is pure logic: no clocks, no sockets, no processes. Time is passed in
as ``now`` (seconds on any monotonic scale) so the rules can be tested exactly.

Rules (docs/DESIGN.md leaves them to us):

* Order. Hosts already known keep their old order; hosts new to the job follow, in the
  order discovery listed them. Rank placement follows this order, so a stable order
  means a new host never pushes existing workers to other ranks.
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

import ipaddress
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from driver.errors import HostSpecError
from driver.events import (
    HostAdded,
    HostBlacklisted,
    HostBlacklistSkipped,
    HostEvent,
    HostRemoved,
    HostReturned,
    HostSlotsChanged,
)

#: Most slots one host may have. A slot is a worker process on that machine, with its own
#: ports, pipes and threads: a stock machine runs out of processes, ports or descriptors
#: long before a few thousand of them, so a bigger count is a typo or garbage. Taking it
#: would make the planner enumerate that many slots at every decision (CPU and memory
#: without bound, as a discovery line ``host:99999999999999999999999`` once did).
MAX_SLOTS_PER_HOST = 1024
#: Most workers one job may have (``-np``, ``--min-np``, ``--max-np``): every round's plan
#: lists all its members in one store value, and a value must stay under etcd's request
#: limit of 1.5 MiB (a member with a long host name takes a few hundred bytes).
MAX_WORKERS = 4096
#: Most slots one host list may hold in all (``-H``, or one discovery run): more hosts may
#: be listed than the job uses, but the planner walks every listed slot at each decision.
MAX_LISTED_SLOTS = 16 * MAX_WORKERS
#: DNS limits (RFC 1035): a name of at most 253 characters, each dot-separated label of
#: at most 63. A longer name can never resolve, so it is an error of the entry.
MAX_HOST_NAME = 253
MAX_HOST_LABEL = 63
_QUOTE_CHARS = 100  # how much of an absurd entry an error message repeats


def quote_entry(text: str) -> str:
    """``text`` quoted for an error message, cut to ``_QUOTE_CHARS`` (a one-line error
    must not repeat a megabyte of garbage)."""
    if len(text) <= _QUOTE_CHARS:
        return repr(text)
    return repr(text[:_QUOTE_CHARS]) + f"... ({len(text)} characters)"


@dataclass(frozen=True)
class HostSlots:
    """A host and how many workers it may run (``slots`` >= 1)."""

    host: str
    slots: int

    def __post_init__(self):
        if not self.host:
            raise HostSpecError("empty host name")
        if not isinstance(self.slots, int) or isinstance(self.slots, bool) or self.slots < 1:
            raise HostSpecError(
                f"bad slots {self.slots!r} for host {self.host!r} (must be a whole number >= 1)"
            )
        if self.slots > MAX_SLOTS_PER_HOST:
            raise HostSpecError(
                f"bad slots {self.slots!r} for host {self.host!r} "
                f"(at most {MAX_SLOTS_PER_HOST} per host)"
            )


# A DNS name or IPv4 literal: letters, digits, '-', '_', '.'; no leading '-' or '.'
# (a leading '-' would be read as an option by ssh).
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*\Z")
_ZONE = re.compile(r"[A-Za-z0-9_.\-]+\Z")
_NUMBER = re.compile(r"[0-9]+\Z")


def _check_ipv6(text: str, entry: str) -> str:
    address, percent, zone = text.partition("%")  # fe80::1%eth0: a link-local address's zone
    try:
        ipaddress.IPv6Address(address)
        if percent and not _ZONE.match(zone):
            raise ValueError(zone)
    except ValueError:
        raise HostSpecError(f"bad IPv6 address {text!r} in {entry!r}") from None
    return text


def split_host(entry: str) -> tuple[str, str | None]:
    """Split ``HOST`` or ``HOST:SUFFIX`` (surrounding whitespace ignored) into the host
    and the suffix (None without ':'), checking the host. An IPv6 address takes a suffix
    only in brackets, ``[fe80::1]:4``; an unbracketed IPv6 address has no suffix.

    Raises ``HostSpecError`` naming the entry and what is wrong with it."""
    text = entry.strip()
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise HostSpecError(f"missing ']' in {text!r}")
        host = _check_ipv6(text[1:close], text) if close > 1 else ""
        rest = text[close + 1 :]
        if rest and not rest.startswith(":"):
            raise HostSpecError(f"unexpected {rest!r} after ']' in {text!r}")
        suffix = rest[1:] if rest else None
    elif text.count(":") > 1:
        try:
            host, suffix = _check_ipv6(text, text), None
        except HostSpecError:
            raise HostSpecError(
                f"bad host {text!r}: more than one ':' and not an IPv6 address "
                f"(write IPv6 with slots as [ADDRESS]:SLOTS)"
            ) from None
    else:
        host, sep, suffix = text.partition(":")
        if not sep:
            suffix = None
    if not host:
        raise HostSpecError(f"empty host in {quote_entry(text)}")
    if ":" not in host:
        _check_host_name(host, text)
    return host, suffix


def _check_host_name(host: str, entry: str) -> None:
    """A DNS name or IPv4 literal that ssh cannot take for an option and DNS can hold.

    Raises ``HostSpecError`` naming the entry."""
    if not _HOST_NAME.match(host):
        raise HostSpecError(f"bad host name {quote_entry(host)} in {quote_entry(entry)}")
    if len(host.rstrip(".")) > MAX_HOST_NAME:
        raise HostSpecError(
            f"host name {quote_entry(host)} is {len(host)} characters long; "
            f"DNS allows {MAX_HOST_NAME}"
        )
    label = max(host.split("."), key=len)
    if len(label) > MAX_HOST_LABEL:
        raise HostSpecError(
            f"host name {quote_entry(host)} has a label of {len(label)} characters; "
            f"DNS allows {MAX_HOST_LABEL} between dots"
        )


def parse_host_slots(entry: str, default_slots: int) -> HostSlots:
    """Parse one ``HOST`` or ``HOST:SLOTS`` entry (see ``split_host`` for the host part).

    ``HOST`` alone gets ``default_slots``. Slots must be a whole number >= 1 (to drain a
    host, leave it out). Raises ``HostSpecError`` naming the entry and the problem."""
    host, slots_text = split_host(entry)
    if slots_text is None:
        return HostSlots(host, default_slots)
    where = f"bad slots {quote_entry(slots_text)} in {quote_entry(entry.strip())}"
    digits = slots_text.lstrip("0")
    if not _NUMBER.match(slots_text) or not digits:
        raise HostSpecError(f"{where} (must be a whole number >= 1)")
    # Length first: a thousand-digit count is too big without converting it.
    if len(digits) > len(str(MAX_SLOTS_PER_HOST)) or int(digits) > MAX_SLOTS_PER_HOST:
        raise HostSpecError(f"{where} (at most {MAX_SLOTS_PER_HOST} per host)")
    return HostSlots(host, int(digits))


def check_listed_slots(hosts: Sequence[HostSlots], source: str) -> None:
    """Raise ``HostSpecError`` naming ``source`` when ``hosts`` hold more than
    ``MAX_LISTED_SLOTS`` slots in all."""
    listed = total_slots(hosts)
    if listed > MAX_LISTED_SLOTS:
        raise HostSpecError(
            f"{source} lists {listed} slots in all; at most {MAX_LISTED_SLOTS} "
            f"(the job uses at most {MAX_WORKERS} workers)"
        )


def total_slots(hosts: Iterable[HostSlots]) -> int:
    """Sum of the hosts' slots."""
    return sum(h.slots for h in hosts)


def available_slots(hosts: Iterable[HostSlots], max_np: int | None) -> int:
    """How many workers the hosts can run at once, capped by ``max_np`` (None: no cap)."""
    slots = total_slots(hosts)
    return slots if max_np is None else min(slots, max_np)


@dataclass(frozen=True)
class HostDiff:
    """What changed between two host lists: hosts added and removed (in their lists'
    order), and hosts whose slot count changed, as ``(host, old_slots, new_slots)``."""

    added: tuple[HostSlots, ...] = ()
    removed: tuple[HostSlots, ...] = ()
    changed: tuple[tuple[str, int, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def hosts_in_use(placed: Iterable[tuple[str, int]]) -> tuple[HostSlots, ...]:
    """The hosts of ``placed`` (``(host, slot)`` pairs), each with slots enough for its
    highest slot, in the order first seen."""
    top: dict[str, int] = {}
    for host, slot in placed:
        top[host] = max(top.get(host, 0), slot + 1)
    return tuple(HostSlots(host, slots) for host, slots in top.items())


def diff_hosts(old: Sequence[HostSlots], new: Sequence[HostSlots]) -> HostDiff:
    """The difference from ``old`` to ``new`` (each a list of distinct hosts)."""
    old_slots = {h.host: h.slots for h in old}
    new_slots = {h.host: h.slots for h in new}
    return HostDiff(
        added=tuple(h for h in new if h.host not in old_slots),
        removed=tuple(h for h in old if h.host not in new_slots),
        changed=tuple(
            (h.host, old_slots[h.host], h.slots)
            for h in new
            if h.host in old_slots and old_slots[h.host] != h.slots
        ),
    )


def order_hosts(
    known_order: Sequence[str], discovered: Sequence[HostSlots]
) -> tuple[HostSlots, ...]:
    """``discovered`` in the job's stable order: hosts named in ``known_order`` first, in
    that order; the others after them, in discovery order. Slot counts are the new ones."""
    by_name = {h.host: h for h in discovered}
    known = [by_name[name] for name in dict.fromkeys(known_order) if name in by_name]
    known_names = {h.host for h in known}
    return tuple(known) + tuple(h for h in discovered if h.host not in known_names)


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


# ----------------------------------------------------------------------------- manager


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
