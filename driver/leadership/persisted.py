"""The leader's persisted state, and a successor's view rebuilt from the store (pure).

* ``state_record``: what the leader writes under ``JobKeys.driver_state`` (a
  ``DriverStateRecord``): the facts a successor needs that the store does not say
  otherwise: the round rules' counters, the blacklist with wall-clock ends, finished
  slots, whether training is done, the worker-id sequence, the workers given up on.
  ``state_changed`` says whether a new record is worth writing (the write time aside).
* ``rebuild_view``: a driver that takes over reads the job's keys once and rebuilds
  what its loop keeps: the current plan, a record per worker (from the registrations;
  a member of the plan that is no longer registered is taken as lost before the
  takeover, or finished when its finish mark is there), the book and the blacklist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from driver.policy import lifecycle
from driver.policy.decisions import Book
from driver.policy.lifecycle import WorkerRecord, WorkerState
from driver.policy.memory.failures import FailureBook
from driver.policy.memory.rounds import RoundBook
from driver.policy.planner import WorkerSlot
from rendezvous.keys import JobKeys
from rendezvous.schema.leader import DriverStateRecord
from rendezvous.schema.rounds import Plan
from rendezvous.schema.workers import WorkerInfo
from rendezvous.store import KeyValue

LOST_BEFORE_TAKEOVER = "lost before this driver took over"
"""The kill reason of a plan member found unregistered at takeover (not held against
its host: nobody saw how it ended)."""

_GIVEN_UP = {
    WorkerState.STOPPING.value: WorkerState.STOPPING,
    WorkerState.KILLED.value: WorkerState.KILLED,
    WorkerState.CHAOS_KILLED.value: WorkerState.CHAOS_KILLED,
}


@dataclass(frozen=True)
class Cooldown:
    """A host's blacklist state: strikes so far, and when (monotonic, in the reader's
    clock) its cooldown ends (None: not blacklisted now)."""

    host: str
    strikes: int
    until: float | None


def state_record(
    term: int,
    book: Book,
    cooldowns: Iterable[Cooldown],
    launched: int,
    workers: Mapping[str, WorkerRecord],
    secret_id: str,
    *,
    now: float,
    wall_now: float,
) -> DriverStateRecord:
    """The record of the leader's state as of ``now`` (monotonic; ``wall_now`` the unix
    time at that moment, to turn cooldown ends into wall-clock times)."""
    cooldowns = list(cooldowns)
    return DriverStateRecord(
        term=term,
        resets=book.rounds.resets,
        failure_streak=book.failures.streak,
        blacklist=[
            [c.host, c.strikes, round(wall_now + (c.until - now), 3)]
            for c in cooldowns
            if c.until is not None
        ],
        strikes=[[c.host, c.strikes] for c in cooldowns if c.strikes],
        done_slots=sorted([host, slot] for host, slot in book.rounds.done_slots),
        training_done=book.training_done,
        launched=launched,
        given_up=sorted(
            [r.worker_id, r.state.value]
            for r in workers.values()
            if r.state.value in _GIVEN_UP and r.state.running
        ),
        secret_id=secret_id,
        written=wall_now,
    )


def state_changed(old: DriverStateRecord | None, new: DriverStateRecord) -> bool:
    """Whether ``new`` says something ``old`` did not (its write time aside; a cooldown
    end that moved by less than a second is the clocks' rounding, not news)."""
    if old is None:
        return True

    def key(record: DriverStateRecord) -> DriverStateRecord:
        return replace(
            record,
            written=0.0,
            blacklist=[[h, s, round(u)] for h, s, u in record.blacklist],
        )

    return key(old) != key(new)


@dataclass(frozen=True)
class AdoptedView:
    """What a driver taking over starts from: ``plan`` (None before the first round),
    ``workers`` (the loop's records), ``book``, ``cooldowns`` (with monotonic ends),
    ``launched`` (the worker-id sequence to go on from) and ``pids``: each registered
    worker's host and pid, to adopt its process. ``secret_id``: the fingerprint the
    previous leader wrote ("" when unknown)."""

    plan: Plan | None
    workers: dict[str, WorkerRecord]
    book: Book
    cooldowns: tuple[Cooldown, ...]
    launched: int
    pids: dict[str, tuple[str, int]]
    secret_id: str = ""


def _read(
    kvs: Sequence[KeyValue], keys: JobKeys
) -> tuple[Plan | None, dict[str, KeyValue], set[str], DriverStateRecord | None]:
    plan: Plan | None = None
    registrations: dict[str, KeyValue] = {}
    finished: set[str] = set()
    state: DriverStateRecord | None = None
    for kv in kvs:
        if kv.key == keys.round:
            plan = Plan.from_json(kv.value)
        elif kv.key.startswith(keys.workers):
            registrations[kv.key[len(keys.workers) :]] = kv
        elif kv.key.startswith(keys.finished("")):
            finished.add(kv.key[len(keys.finished("")) :])
        elif kv.key == keys.driver_state:
            state = DriverStateRecord.from_json(kv.value)
    return plan, registrations, finished, state


def _sequence(worker_id: str) -> int:
    """N of a worker id ``host-slot-N`` (0 for another form)."""
    tail = worker_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def rebuild_view(
    kvs: Sequence[KeyValue], keys: JobKeys, *, now: float, wall_now: float
) -> AdoptedView:
    """The view of a job read as ``kvs`` (every key under ``keys.prefix`` at one
    revision), as of ``now`` (monotonic) and ``wall_now`` (unix time) (see the module
    docstring). Unreadable registrations are skipped."""
    plan, registrations, finished, state = _read(kvs, keys)
    state = state or DriverStateRecord(term=0)
    given_up = {worker_id: _GIVEN_UP[s] for worker_id, s in state.given_up if s in _GIVEN_UP}
    records: dict[str, WorkerRecord] = {}
    pids: dict[str, tuple[str, int]] = {}
    for worker_id, kv in registrations.items():
        try:
            info = WorkerInfo.from_json(kv.value)
        except (ValueError, TypeError):
            continue
        rec = lifecycle.registered(
            WorkerRecord.launched(worker_id, info.host, info.slot, now),
            info,
            kv.create_revision,
            now,
        )
        if worker_id in given_up:
            rec = replace(rec, state=given_up[worker_id], kill_reason="given up by the last leader")
        records[worker_id] = rec
        pids[worker_id] = (info.host, info.pid)
    done_slots = {(str(h), int(s)) for h, s in state.done_slots}
    training_done = state.training_done
    if plan is not None:
        for m in plan.members:
            if m.worker_id in records:
                continue
            lost = WorkerRecord.launched(m.worker_id, m.host, m.slot, now)
            if m.worker_id in finished:
                records[m.worker_id] = lifecycle.exited(lost, 0, now)
                done_slots.add((m.host, m.slot))
                training_done = True
            else:
                records[m.worker_id] = replace(
                    lifecycle.exited(lost, -1, now), kill_reason=LOST_BEFORE_TAKEOVER
                )
    lost_members = plan is not None and any(
        not records[m.worker_id].state.running for m in plan.members
    )
    rounds = RoundBook(
        started_at=now,
        resets=state.resets,
        done_slots=frozenset(WorkerSlot(h, s) for h, s in done_slots),
        training_done_at=now if training_done else None,
        change_at=now if lost_members else None,
    )
    book = Book(rounds, failures=FailureBook(streak=state.failure_streak))
    strikes = {str(h): int(n) for h, n in state.strikes}
    cooldowns = {
        str(h): Cooldown(str(h), int(n), now + (float(u) - wall_now))
        for h, n, u in state.blacklist
        if float(u) > wall_now
    }
    for host, n in strikes.items():
        cooldowns.setdefault(host, Cooldown(host, n, None))
    launched = max([state.launched, *(_sequence(w) for w in (*registrations, *records))])
    return AdoptedView(
        plan, records, book, tuple(cooldowns.values()), launched, pids, state.secret_id
    )
