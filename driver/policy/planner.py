"""Round planning: who is in the next round, with which ranks, and which slots need a worker.

Pure functions over ``rendezvous.schema.rounds`` records; the driver does the I/O around them.

Rank rules (docs/DESIGN.md, round protocol): survivors of the previous round keep their
relative order, so rank 0 is the oldest surviving worker and holds the newest committed
state; new workers follow, in host order then slot. Local and cross ranks follow
Horovod's definitions:

* ``local_rank`` / ``local_size``: the worker's index among the round's workers on the
  same host, in global rank order, and how many there are;
* ``cross_rank`` / ``cross_size``: the worker's index among the round's workers with the
  same ``local_rank`` (at most one per host), in global rank order, and how many there
  are. This is what splitting the world by ``local_rank`` (MPI_Comm_split with rank as
  the key) gives, so it matches ``elastic`` under ``mpiexec``.

A *world* (``--restart-workers``, ``driver.policy.restarts``) is laid out before any of
its workers starts: every slot of the usable hosts up to ``--max-np``, in placement
order, ranked in that order (so each host's ranks are consecutive, as torchrun's are);
its ``group_rank`` is the index of the worker's host among the world's hosts. The plan
the driver keeps of a world is round ``World.number``, built by ``world_plan``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar

from driver.hosts.slots import HostSlots
from rendezvous.schema.rounds import Member, Plan
from rendezvous.schema.workers import WorkerInfo


class WorkerSlot(NamedTuple):
    """A place for one worker: slot ``slot`` (0-based) of ``host``."""

    host: str
    slot: int


class Placed(Protocol):
    """Anything that sits in a slot: a registration, or the driver's worker record."""

    @property
    def host(self) -> str: ...

    @property
    def slot(self) -> int: ...


P = TypeVar("P", bound=Placed)


def slot_of(worker: Placed) -> WorkerSlot:
    return WorkerSlot(worker.host, worker.slot)


def allowed_slots(hosts: Sequence[HostSlots]) -> tuple[WorkerSlot, ...]:
    """Every slot of ``hosts`` (already ordered, blacklisted hosts left out), in host
    order then slot order: the order new workers are placed and ranked in."""
    return tuple(WorkerSlot(h.host, s) for h in hosts for s in range(h.slots))


def _slot_positions(hosts: Sequence[HostSlots]) -> dict[WorkerSlot, int]:
    return {slot: i for i, slot in enumerate(allowed_slots(hosts))}


def displaced_workers(workers: Sequence[P], hosts: Sequence[HostSlots]) -> tuple[P, ...]:
    """The workers (registrations or the driver's records) whose slot is no longer
    allowed (host removed or blacklisted, or the host now has fewer slots). No plan
    includes them; the driver stops them."""
    positions = _slot_positions(hosts)
    return tuple(w for w in workers if slot_of(w) not in positions)


def local_layout(hosts: Sequence[str]) -> tuple[list[int], Counter[str]]:
    """For workers on ``hosts`` (one entry per worker, in rank order): each one's index
    among the workers of its host, and how many each host has (see the module
    docstring: what a round and a world of restart mode both give their workers)."""
    local_sizes = Counter(hosts)
    ranks: list[int] = []
    seen_on_host: Counter[str] = Counter()
    for host in hosts:
        ranks.append(seen_on_host[host])
        seen_on_host[host] += 1
    return ranks, local_sizes


def build_plan(round_id: int, workers: Sequence[WorkerInfo]) -> Plan:
    """The plan of round ``round_id`` with ``workers`` in rank order (rank = index).
    Computes local and cross ranks (see the module docstring)."""
    local_ranks, local_sizes = local_layout([w.host for w in workers])
    cross_sizes = Counter(local_ranks)
    cross_ranks: list[int] = []
    seen_with_local_rank: Counter = Counter()
    for local_rank in local_ranks:
        cross_ranks.append(seen_with_local_rank[local_rank])
        seen_with_local_rank[local_rank] += 1
    members = tuple(
        Member(
            worker_id=w.worker_id,
            host=w.host,
            slot=w.slot,
            address=w.address,
            rank=rank,
            local_rank=local_ranks[rank],
            local_size=local_sizes[w.host],
            cross_rank=cross_ranks[rank],
            cross_size=cross_sizes[local_ranks[rank]],
        )
        for rank, w in enumerate(workers)
    )
    return Plan(round_id=round_id, members=members)


def next_plan(
    previous: Plan | None,
    live: Sequence[WorkerInfo],
    hosts: Sequence[HostSlots],
    min_np: int,
    max_np: int | None,
) -> Plan | None:
    """The next round's plan, or None when fewer than ``min_np`` workers can be in it.

    ``live``: registered, alive workers in registration order. ``hosts``: the usable
    hosts in the job's order (blacklisted ones left out). Only workers on an allowed slot
    take part. Survivors (members of ``previous`` still live) come first in their old
    relative order, then new workers in host order, slot order, registration order; the
    list is cut at ``max_np`` (None: no cap). If two workers claim one slot (a replacement
    registered before the old process's lease expired), a survivor wins, else the one that
    registered first. For the first round the driver passes ``-np`` as ``min_np``.

    The result always has ``round_id`` = previous round + 1 (1 for the first), even when
    its membership is unchanged: use ``needs_new_round`` to decide whether to publish it.

    Raises ``ValueError`` if ``min_np`` < 1 or ``max_np`` < ``min_np``."""
    if min_np < 1:
        raise ValueError(f"min_np must be >= 1, got {min_np}")
    if max_np is not None and max_np < min_np:
        raise ValueError(f"max_np {max_np} is below min_np {min_np}")
    positions = _slot_positions(hosts)
    eligible: dict[str, WorkerInfo] = {}
    for w in live:
        if slot_of(w) in positions:
            eligible.setdefault(w.worker_id, w)
    previous_ids = previous.worker_ids if previous is not None else ()
    survivors = [eligible[i] for i in previous_ids if i in eligible]
    survivor_ids = set(previous_ids)
    # sorted() is stable, so workers on the same slot stay in registration order.
    newcomers = sorted(
        (w for w in eligible.values() if w.worker_id not in survivor_ids),
        key=lambda w: positions[slot_of(w)],
    )
    chosen: list[WorkerInfo] = []
    taken: set[WorkerSlot] = set()
    for w in survivors + newcomers:
        if max_np is not None and len(chosen) >= max_np:
            break
        if slot_of(w) in taken:
            continue
        taken.add(slot_of(w))
        chosen.append(w)
    if len(chosen) < min_np:
        return None
    round_id = previous.round_id + 1 if previous is not None else 1
    return build_plan(round_id, chosen)


def needs_new_round(previous: Plan | None, candidate: Plan | None) -> bool:
    """True when ``candidate`` (from ``next_plan``) should be published: it exists and its
    members or their rank order differ from ``previous``. (A worker's host, slot and
    address never change under one worker id, so comparing ids in rank order suffices.)"""
    if candidate is None:
        return False
    return previous is None or candidate.worker_ids != previous.worker_ids


def round_is_intact(plan: Plan, live: Sequence[WorkerInfo], hosts: Sequence[HostSlots]) -> bool:
    """True when every member of ``plan`` is still live and on an allowed slot. False
    means the round is broken: its workers must re-form, whether or not a new plan with
    ``min_np`` workers is possible yet."""
    positions = _slot_positions(hosts)
    live_ids = {w.worker_id for w in live if slot_of(w) in positions}
    return all(m.worker_id in live_ids for m in plan.members)


def free_slots(
    hosts: Sequence[HostSlots], occupied: Iterable[tuple[str, int]], max_np: int | None
) -> tuple[WorkerSlot, ...]:
    """The free slots that need a (re)launched worker, in placement order (host order,
    then slot), so that the occupied and returned slots together stay within ``max_np``.

    ``occupied``: ``(host, slot)`` of every worker that is alive or being launched.
    Occupied slots that are no longer allowed do not count against ``max_np``: those
    workers are being stopped (see ``displaced_workers``)."""
    slots = allowed_slots(hosts)
    occupied_allowed = set(map(tuple, occupied)) & set(slots)
    free = [s for s in slots if s not in occupied_allowed]
    room = len(free) if max_np is None else max(0, max_np - len(occupied_allowed))
    return tuple(free[:room])


def hold_growth_for_joiners(
    round_intact: bool, joiner_ages: Sequence[float], window: float
) -> bool:
    """True when publishing a bigger round should wait: the current round still works and
    workers launched less than ``window`` seconds ago (``joiner_ages``) have not registered
    yet. Workers started together (a host added, several slots refilled) then join in one
    re-form instead of one each. A broken round never waits: its survivors are idle."""
    return round_intact and any(age < window for age in joiner_ages)


class Seat(NamedTuple):
    """A worker's place in a world of restart mode: its slot, and its ranks as torchrun
    gives them (``group_rank``: the index of its host among the world's hosts)."""

    host: str
    slot: int
    rank: int
    local_rank: int
    local_size: int
    group_rank: int


@dataclass(frozen=True)
class World:
    """A world of restart mode: workers started together, whose ranks never change.
    ``number`` counts the job's worlds from 1 (the driver's plan of the world is round
    ``number``); ``restarts`` counts the worlds started after a failure
    (``TORCHELASTIC_RESTART_COUNT``); ``seats`` in rank order."""

    number: int
    restarts: int
    seats: tuple[Seat, ...]

    @property
    def size(self) -> int:
        return len(self.seats)

    @property
    def hosts(self) -> tuple[str, ...]:
        """The world's hosts, in ``group_rank`` order."""
        return tuple(dict.fromkeys(seat.host for seat in self.seats))


def world_slots(hosts: Sequence[HostSlots], max_np: int | None) -> tuple[WorkerSlot, ...]:
    """The slots a world started now takes: every slot of ``hosts`` (usable, in the
    job's order) in placement order, cut at ``max_np`` (None: no cap)."""
    slots = allowed_slots(hosts)
    return slots if max_np is None else slots[:max_np]


def lay_out_world(number: int, restarts: int, slots: Sequence[WorkerSlot]) -> World:
    """World ``number`` on ``slots`` (rank = index; see the module docstring)."""
    hosts = [s.host for s in slots]
    ranks, sizes = local_layout(hosts)
    groups = {host: i for i, host in enumerate(dict.fromkeys(hosts))}
    seats = tuple(
        Seat(s.host, s.slot, rank, ranks[rank], sizes[s.host], groups[s.host])
        for rank, s in enumerate(slots)
    )
    return World(number, restarts, seats)


def world_plan(world: World, worker_ids: Sequence[str]) -> Plan:
    """The plan the driver keeps of ``world`` (round ``world.number``), its seats taken
    by ``worker_ids`` in rank order: one per seat, or fewer when a worker could not be
    started (the seats before it; the world then ends at once). Its members have no
    address: a world's workers find each other through torch's own store
    (``MASTER_ADDR``).

    Raises:
        ValueError: more worker ids than seats.
    """
    if len(worker_ids) > world.size:
        raise ValueError(f"{len(worker_ids)} worker ids for a world of {world.size}")
    return build_plan(
        world.number,
        [WorkerInfo(w, seat.host, seat.slot, 0, "") for w, seat in zip(worker_ids, world.seats)],
    )
