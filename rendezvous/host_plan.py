"""A round's plan as each host reads it: a small head every member needs, and one part
per host with what that host's members need (pure records and pure functions; the
writes are ``plan_ops``, done by the driver, the reads ``read_view``).

The driver keeps the whole plan (``rendezvous.schema.rounds.Plan``, every member in rank order)
and still writes it to ``JobKeys.round``, once per round: that is the record of the
job (a successor adopts it, the finish transaction is guarded by the head written
with it). Nobody follows that key. What hosts follow is ``JobKeys.plan_head``, a
``RoundHead`` of a constant size (the round, its size, the leader term, a digest of the
whole plan, what its members do at its start), and what a host needs of a round is its
own ``HostPart`` under ``JobKeys.plan_host(host, round)`` (two keys per host, by the
round's parity, overwritten every other round): its members (ranks, local and cross ranks, addresses) and the few members of
other hosts they connect to (each member's ring neighbours, and the first members of
the hosts before and after it, the leaders of a hierarchical ring). So the bytes a
round sends grow with N, not N x N, and a worker decodes a constant amount whatever the
job's size. A plan of at most ``HEAD_PARTS_MEMBERS`` members carries every part in its
head too: a small job's workers read nothing after the head's watch event, as when the
event was the plan. An agent watches its host's parts as well as the head
(``LatestParts``): a large plan's parts are written before its head, so the part is
there when the head's event comes and the agent reads nothing either; a part not yet
seen is read once (``read_view``).

Guarantees (``docs/DESIGN.md``, the round protocol):

* exactly one plan per round number: the parts carry the round and the digest of the
  plan they were cut from, and a part whose digest is not the head's is not this
  round's (a part written by a driver whose publish never committed, for the same
  number, or a part of another round);
* fencing: every write is the leader's fenced transaction, and the head carries the
  term as the plan did;
* the finish transaction compares the head's value: head and plan change together.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Callable

from rendezvous.keys import JobKeys
from rendezvous.records import Delete, KeyValue, Put
from rendezvous.schema.rounds import Member, Plan

#: parts written in the transaction that publishes the round when the plan has at most
#: this many hosts (etcd refuses a transaction of more than 128 operations by default);
#: a larger plan's parts are written before it, ``PART_BATCH`` hosts per transaction
INLINE_PARTS = 96
PART_BATCH = 96
#: a plan of at most this many members carries every host's part in its head too: a
#: small job's workers then read nothing after the head's watch event (as when the
#: whole plan was the event), while a large job's head stays of a constant size
HEAD_PARTS_MEMBERS = 16


@dataclass(frozen=True)
class RoundHead:
    """What every member of round ``round_id`` needs to know of the world: its
    ``size``, the leader ``term`` that published it, the ``digest`` of the whole plan
    (``plan_digest``), and the ``snapshot``, ``snapshot_token`` and ``handover`` of
    ``Plan``."""

    round_id: int
    size: int
    term: int = 0
    digest: str = ""
    snapshot: str = ""
    snapshot_token: str = ""
    handover: bool = False
    parts: tuple[HostPart, ...] = ()  # every host's, in a plan of few members

    def to_json(self) -> bytes:
        raw = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "parts"}
        if self.parts:
            raw["parts"] = [p.to_dict() for p in self.parts]
        return json.dumps(raw, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RoundHead:
        """Raises:
        ValueError: not a head (not JSON, or a field missing or of the wrong type)."""
        try:
            raw = json.loads(data)
            return cls(
                round_id=int(raw["round_id"]),
                size=int(raw["size"]),
                term=int(raw.get("term", 0)),
                digest=str(raw.get("digest", "")),
                snapshot=str(raw.get("snapshot", "")),
                snapshot_token=str(raw.get("snapshot_token", "")),
                handover=bool(raw.get("handover", False)),
                parts=tuple(HostPart.from_dict(p) for p in raw.get("parts", ())),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a round head: {exc!r}") from None

    def part_of(self, host: str) -> HostPart | None:
        """``host``'s part when the head carries the parts (None: not here, or no
        member on that host)."""
        return next((p for p in self.parts if p.host == host), None)


@dataclass(frozen=True)
class Peer:
    """A member of another host that a member of this host connects to."""

    rank: int
    worker_id: str
    address: str


@dataclass(frozen=True)
class HostPart:
    """Host ``host``'s part of round ``round_id`` (the plan of digest ``digest``): its
    ``members`` in rank order, and the ``peers`` on other hosts they connect to."""

    round_id: int
    digest: str
    host: str
    members: tuple[Member, ...] = ()
    peers: tuple[Peer, ...] = ()

    def to_dict(self) -> dict:
        return {
            "round_id": self.round_id,
            "digest": self.digest,
            "host": self.host,
            "members": [m.to_dict() for m in self.members],
            "peers": [[p.rank, p.worker_id, p.address] for p in self.peers],
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> HostPart:
        """Raises:
        ValueError: not a host part."""
        try:
            return cls.from_dict(json.loads(data))
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a host part: {exc!r}") from None

    @classmethod
    def from_dict(cls, raw: dict) -> HostPart:
        """Raises:
        ValueError: not a host part."""
        try:
            return cls(
                round_id=int(raw["round_id"]),
                digest=str(raw["digest"]),
                host=str(raw["host"]),
                members=tuple(Member(**m) for m in raw["members"]),
                peers=tuple(Peer(int(r), str(w), str(a)) for r, w, a in raw["peers"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a host part: {exc!r}") from None


@dataclass(frozen=True)
class RoundView:
    """A round as one host sees it: the ``head`` and the host's ``part`` (None: the
    round has no member on this host). What a worker holds instead of the whole plan;
    it answers what a worker asks of its round in constant time."""

    head: RoundHead
    part: HostPart | None = None
    _by_rank: Mapping[int, tuple[str, str]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        known: dict[int, tuple[str, str]] = {}
        if self.part is not None:
            known.update((p.rank, (p.worker_id, p.address)) for p in self.part.peers)
            known.update((m.rank, (m.worker_id, m.address)) for m in self.part.members)
        object.__setattr__(self, "_by_rank", known)

    @property
    def round_id(self) -> int:
        return self.head.round_id

    @property
    def size(self) -> int:
        return self.head.size

    @property
    def term(self) -> int:
        return self.head.term

    @property
    def snapshot(self) -> str:
        return self.head.snapshot

    @property
    def snapshot_token(self) -> str:
        return self.head.snapshot_token

    @property
    def handover(self) -> bool:
        return self.head.handover

    @property
    def members(self) -> tuple[Member, ...]:
        """The members on this host (not the round's: see ``size``)."""
        return self.part.members if self.part is not None else ()

    def member(self, worker_id: str) -> Member | None:
        """The place of ``worker_id`` if it is a member on this host."""
        return next((m for m in self.members if m.worker_id == worker_id), None)

    def worker_at(self, rank: int) -> str | None:
        """The worker id of member ``rank`` when this host knows it (its own members and
        their peers), else None."""
        known = self._by_rank.get(rank)
        return known[0] if known is not None else None

    def address_of(self, rank: int) -> str | None:
        """The data-plane address of member ``rank`` when this host knows it, else None."""
        known = self._by_rank.get(rank)
        return known[1] if known is not None else None


def plan_digest(plan: Plan, encoded: bytes | None = None) -> str:
    """A digest of the whole plan (``encoded``: its ``to_json``, when already made):
    names it apart from any other plan of its number."""
    return hashlib.sha256(plan.to_json() if encoded is None else encoded).hexdigest()[:24]


def head_of(plan: Plan, digest: str | None = None) -> RoundHead:
    return RoundHead(
        round_id=plan.round_id,
        size=plan.size,
        term=plan.term,
        digest=plan_digest(plan) if digest is None else digest,
        snapshot=plan.snapshot,
        snapshot_token=plan.snapshot_token,
        handover=plan.handover,
    )


def split_plan(plan: Plan, encoded: bytes | None = None) -> tuple[RoundHead, dict[str, HostPart]]:
    """``plan``'s head and each host's part (pure; linear in the plan's size;
    ``encoded``: the plan's ``to_json``, when already made).

    A host's peers: each member's ring neighbours (rank - 1 and rank + 1, around the
    ring) on other hosts, and the first members of the hosts before and after it in
    order of their first ranks (the leaders' ring of a hierarchical transport: one
    leader per host, the member of lowest rank, as ``elastic.comm.transports.topology``
    groups them when hosts are machines)."""
    head = head_of(plan, plan_digest(plan, encoded))
    size = plan.size
    by_host: dict[str, list[Member]] = {}
    for m in plan.members:
        by_host.setdefault(m.host, []).append(m)
    leaders = [ms[0] for ms in by_host.values()]
    leader_index = {m.host: i for i, m in enumerate(leaders)}
    parts: dict[str, HostPart] = {}
    for host, members in by_host.items():
        wanted: set[int] = set()
        for m in members:
            wanted.update(((m.rank - 1) % size, (m.rank + 1) % size))
        if len(leaders) > 1:
            i = leader_index[host]
            wanted.update(
                (leaders[(i - 1) % len(leaders)].rank, leaders[(i + 1) % len(leaders)].rank)
            )
        own = {m.rank for m in members}
        peers = tuple(
            Peer(r, plan.members[r].worker_id, plan.members[r].address)
            for r in sorted(wanted - own)
        )
        parts[host] = HostPart(plan.round_id, head.digest, host, tuple(members), peers)
    if size <= HEAD_PARTS_MEMBERS:
        head = replace(head, parts=tuple(parts.values()))
    return head, parts


def view_of(plan: Plan, host: str) -> RoundView:
    """Round ``plan`` as ``host`` reads it (pure: what ``read_view`` returns from the
    store once the plan is published)."""
    head, parts = split_plan(plan)
    return RoundView(head, parts.get(host))


@dataclass(frozen=True)
class PlanWrites:
    """How to publish a plan: ``before`` (transactions of parts, each to be written and
    fenced on its own, before the plan; empty for a plan of at most ``INLINE_PARTS``
    hosts), ``publish`` (the operations of the one transaction that makes the plan the
    job's: the plan, its head, and the parts and deletions when few) and ``after`` (the
    deletions of the parts of hosts the plan no longer has, when many: written after
    it, so a round's parts stay readable while it is the job's)."""

    before: tuple[tuple[Put | Delete, ...], ...]
    publish: tuple[Put | Delete, ...]
    head: RoundHead
    after: tuple[tuple[Put | Delete, ...], ...] = ()


def plan_ops(keys: JobKeys, plan: Plan, previous: Plan | None) -> PlanWrites:
    """The writes that publish ``plan`` (pure; see ``PlanWrites``). ``previous``: the
    plan published before it (None: none known), whose hosts that ``plan`` does not
    have lose their parts (a host's part keys are overwritten otherwise).

    When the parts do not fit in the publishing transaction, they are written before
    it: an agent watching its parts then holds its part when the head's event comes."""
    whole = plan.to_json()
    head, parts = split_plan(plan, whole)
    puts = [Put(keys.plan_host(h, plan.round_id), p.to_json()) for h, p in parts.items()]
    gone = [
        Delete(keys.plan_host_prefix(h), prefix=True)
        for h in sorted(hosts_of(previous) - parts.keys())
    ]
    main: list[Put | Delete] = [Put(keys.round, whole), Put(keys.plan_head, head.to_json())]
    if len(puts) + len(gone) <= INLINE_PARTS:
        return PlanWrites((), (*main, *puts, *gone), head)
    return PlanWrites(batched(puts), tuple(main), head, batched(gone))


def hosts_of(plan: Plan | None) -> set[str]:
    """The hosts that have a part of ``plan`` (pure)."""
    return {m.host for m in plan.members} if plan is not None else set()


def batched(ops: Sequence[Put | Delete]) -> tuple[tuple[Put | Delete, ...], ...]:
    """``ops`` in transactions of at most ``PART_BATCH`` operations (pure)."""
    return tuple(tuple(ops[i : i + PART_BATCH]) for i in range(0, len(ops), PART_BATCH))


def view_from(head: RoundHead, part_value: bytes | None) -> RoundView:
    """The view of ``head`` given the value read under its host's part key (None: no
    part; a head that carries the parts needs none: give it the host's). A part of
    another plan of the same number (its digest differs) is no part of this round.

    Raises:
        ValueError: the part does not parse."""
    if part_value is None:
        return RoundView(head)
    part = HostPart.from_json(part_value)
    if part.round_id != head.round_id or part.digest != head.digest:
        return RoundView(head)
    return RoundView(head, part)


def read_view(
    get: Callable[[str], KeyValue | None],
    keys: JobKeys,
    head: RoundHead,
    host: str,
    known: Callable[[str], bytes | None] | None = None,
) -> RoundView | None:
    """Round ``head`` as ``host`` reads it: from the head when it carries the parts,
    from ``known`` (a key's value as a watch last delivered it: ``LatestParts.get``)
    when the part there is the head's, else its part read once with ``get`` (a
    store's). None when the round is already over: its part was overwritten by a newer
    round's, and the head is newer (its own event follows).

    Raises:
        RendezvousError: from ``get``.
        ValueError: the part or the head read does not parse."""
    if head.parts:  # a small plan's head: every part is in it, nothing to read
        return RoundView(head, head.part_of(host))
    key = keys.plan_host(host, head.round_id)
    seen = known(key) if known is not None else None
    if seen is not None and (view := view_from(head, seen)).part is not None:
        return view
    kv = get(key)
    view = view_from(head, kv.value if kv is not None else None)
    if view.part is not None:
        return view
    current = get(keys.plan_head)
    if current is not None and RoundHead.from_json(current.value).round_id > head.round_id:
        return None
    return view


class LatestParts:
    """A host's part keys' values as its watch last delivered them (any thread): its
    ``get`` is what ``read_view`` is given, so that a head whose part came first needs
    no read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, bytes] = {}

    def seen(self, key: str, value: bytes | None) -> None:
        """``key`` now holds ``value`` (None: deleted)."""
        with self._lock:
            if value is None:
                self._values.pop(key, None)
            else:
                self._values[key] = value

    def reset(self, values: Mapping[str, bytes]) -> None:
        """The keys hold ``values`` and nothing else (a watch's fresh read)."""
        with self._lock:
            self._values = dict(values)

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._values.get(key)
