"""A round as the driver publishes it: ``Plan`` (its members in rank order, under
``JobKeys.round``), ``Member`` (one worker's place in it), and the pure rules a worker
takes a newer plan by (``plan_is_current``, ``handover_for``). The driver is the only
writer of plans; what each host reads of one is ``rendezvous.host_plan``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol

#: what the members of a round do with their state at its start (``Plan.snapshot``)
SNAPSHOT_NOW = "now"
SNAPSHOT_FINAL = "final"


@dataclass(frozen=True)
class Member:
    """One worker's place in a round."""

    worker_id: str
    host: str
    slot: int
    address: str
    rank: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    def to_dict(self) -> dict:
        """Its fields (what ``dataclasses.asdict`` gives, without its deep copy: a plan
        of thousands of members is encoded at every round)."""
        return dict(vars(self))


@dataclass(frozen=True)
class Plan:
    """Round ``round_id``: its members in rank order. Rounds only grow. ``term``: the
    leader term of the driver that published it (0 in plans made outside a job); a
    worker refuses a plan of a term older than the newest it has seen
    (``plan_is_current``). ``snapshot``: what the members do with their state once the
    round formed, before they train: nothing (""), write a snapshot of it and train on
    (``SNAPSHOT_NOW``: a host is about to go), or write one and stop
    (``SNAPSHOT_FINAL``: the job is being stopped); ``snapshot_token``: that snapshot's
    name among attempts at the same commit (fresh for each such round). ``handover``:
    the round before it still works and only loses members that leave on purpose (a
    drained host): its members finish the step in flight and change rounds at their
    next commit, instead of abandoning that step at once (nothing is rolled back), and
    those left out end there (``elastic.runtime``)."""

    round_id: int
    members: tuple[Member, ...] = field(default_factory=tuple)
    term: int = 0
    snapshot: str = ""
    snapshot_token: str = ""
    handover: bool = False

    @property
    def size(self) -> int:
        return len(self.members)

    def member(self, worker_id: str) -> Member | None:
        for m in self.members:
            if m.worker_id == worker_id:
                return m
        return None

    @property
    def worker_ids(self) -> tuple[str, ...]:
        return tuple(m.worker_id for m in self.members)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "round_id": self.round_id,
                "members": [m.to_dict() for m in self.members],
                "term": self.term,
                **({"snapshot": self.snapshot} if self.snapshot else {}),
                **({"snapshot_token": self.snapshot_token} if self.snapshot_token else {}),
                **({"handover": True} if self.handover else {}),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Plan:
        raw = json.loads(data)
        return cls(
            round_id=int(raw["round_id"]),
            members=tuple(Member(**m) for m in raw["members"]),
            term=int(raw.get("term", 0)),
            snapshot=str(raw.get("snapshot", "")),
            snapshot_token=str(raw.get("snapshot_token", "")),
            handover=bool(raw.get("handover", False)),
        )


class RoundLike(Protocol):
    """What a worker reads of a round: the whole ``Plan``, or the view of it its host
    reads (``rendezvous.host_plan.RoundView``)."""

    @property
    def round_id(self) -> int: ...

    @property
    def term(self) -> int: ...

    @property
    def handover(self) -> bool: ...

    def member(self, worker_id: str) -> Member | None: ...


def handover_for(
    plan: RoundLike, latest: RoundLike | None, current: RoundLike | None, worker_id: str
) -> tuple[bool, bool]:
    """How worker ``worker_id`` takes the newer ``plan``, having formed the round
    ``current`` (None: none yet) and seen ``latest`` before it (pure): whether it defers
    the change to its next commit, and whether ``plan`` hands it over (it leaves).

    It defers when ``plan`` is a handover (``Plan.handover``) and so is every round
    published since its own: its ring still holds every member, so the step in flight
    ends there. A newcomer, with no ring yet, never defers. ``plan`` hands it over when
    it is a handover that leaves out a worker of ``current`` or of ``latest``."""
    defer = (
        plan.handover
        and current is not None
        and latest is not None
        and (latest.round_id == current.round_id or latest.handover)
    )
    was_in = any(p is not None and p.member(worker_id) is not None for p in (current, latest))
    return defer, plan.handover and was_in and plan.member(worker_id) is None


def plan_is_current(plan: RoundLike, latest: RoundLike | None, highest_term: int) -> bool:
    """Whether a worker takes ``plan``, having ``latest`` and the leader term
    ``highest_term`` seen so far (pure): a plan of an older term comes from a driver
    that has lost the lead (a paused old leader that woke up) and is refused; else only
    a newer round counts."""
    if plan.term < highest_term:
        return False
    return latest is None or plan.round_id > latest.round_id
