"""Hosts and their slots (pure): ``HostSlots`` and its parsing (``-H``, discovery
lines), the limits on what a host list may hold, and how one list differs from the next.

Order: hosts already known keep their old order; hosts new to the job follow, in the
order discovery listed them (``order_hosts``). Rank placement follows this order, so a
stable order means a new host never pushes existing workers to other ranks.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from driver.errors import HostSpecError

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
