"""Warm spares (``--spares N``): which spare processes run, and when one takes a member's
place (pure).

A spare is a worker process started ahead of need: it runs the script up to
``elastic.init()``, registers, and waits, a member of no round and on no slot (its
record's ``slot`` is its index among its host's spares). It is in no plan, so in no
collective, until it is promoted; promoting it costs a store write, not a process start
and its imports.

The rules:

* Filling a slot (``fill_slots``): a free slot goes to a registered spare of its host
  (``Promote``; the longest registered first), else to a fresh process (``Launch``). A
  spare still starting is not waited for: the slot gets a fresh process, the spare
  stays a spare. A spare never moves to another host (it runs there).
* Keeping the pool (``spares_to_launch``): each usable host runs ``--spares`` spares;
  a missing one is launched (``LaunchSpare``), none once training is done. Not at
  once after a promotion on the host (``spare_promoted``): ``SPARE_REFILL_DELAY``
  later, so that the new spare's start and imports do not take the CPU from the world
  being re-formed with the promoted one (``WORLD_SPARE_REFILL_DELAY`` in restart
  mode, where a whole world starts its program). None on a host where a spare died before
  registering less than ``SPARE_RETRY_DELAY`` ago (a script that never reaches
  ``init()`` there would otherwise be started again in a loop). A ``Wait`` says when.
* Hosts (``spares_to_stop``): spares run only on usable hosts: a spare whose host left
  the job, is blacklisted or cooling down is stopped, and none is started there.
* Starting (``spares_to_launch``): spares start once the first round formed, so they
  do not slow the first workers' start; a spare that cannot be started
  (``spare_launch_failed``) is lost like one that died before registering.
* A spare's exit (``spare_exited``): quiet. No round changes, no failure streak, no job
  failure: a ``SpareLost`` event, and its host's failure count for blacklisting (a host
  whose processes die is a bad host, spare or not). A spare that died before it
  registered holds its host's next spare for ``SPARE_RETRY_DELAY``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from driver.events import SpareLost, SparePromoted, WorkerStopped, WorkerStopping
from driver.hosts.slots import HostSlots
from driver.policy import lifecycle
from driver.policy.decisions import (
    Book,
    CountFailure,
    Decision,
    Launch,
    LaunchSpare,
    Promote,
    Report,
    Step,
    Stop,
    Wait,
)
from driver.policy.lifecycle import WorkerRecord, Workers, WorkerState
from driver.policy.memory.spares import SpareBook, SpareHold
from driver.policy.planner import WorkerSlot
from rendezvous.schema.rounds import Plan

#: after a spare died before it registered, how long its host gets no new spare
SPARE_RETRY_DELAY = 5.0
#: after a spare of a host was promoted, how long before its replacement starts (the
#: re-formed round's first steps first: a process start and its imports take a core)
SPARE_REFILL_DELAY = 1.0
#: the same in restart mode: every worker of the host starts its program at once there
#: (its group, its checkpoint), and a spare's imports would take the CPU from them
WORLD_SPARE_REFILL_DELAY = 2.0


def fill_slots(free: Sequence[WorkerSlot], workers: Workers) -> list[Launch | Promote]:
    """For each free slot, in order: the promotion of a registered spare of its host
    (longest registered first), else the launch of a fresh worker."""
    ready: dict[str, list[WorkerRecord]] = defaultdict(list)
    for r in sorted(workers.values(), key=lambda r: (r.registered_seq, r.worker_id)):
        if r.ready_spare:
            ready[r.host].append(r)
    decisions: list[Launch | Promote] = []
    for host, slot in free:
        spares = ready[host]
        if spares:
            decisions.append(Promote(spares.pop(0).worker_id, host, slot))
        else:
            decisions.append(Launch(host, slot))
    return decisions


def promotion_event(rec: WorkerRecord, slot: int, now: float) -> SparePromoted:
    """What a promotion says: the spare, its new slot, how long it waited."""
    return SparePromoted(
        worker=rec.worker_id, host=rec.host, slot=slot, waited=round(now - rec.since, 3)
    )


def _holds(book: Book, now: float) -> dict[str, float]:
    return {h.host: h.until for h in book.spares.holds if h.until > now}


def _held(book: Book, host: str, until: float, now: float) -> Book:
    """The book with no spare started on ``host`` before ``until`` (a later hold stays)."""
    holds = _holds(book, now)
    holds[host] = max(until, holds.get(host, until))
    spares = SpareBook(tuple(SpareHold(h, t) for h, t in sorted(holds.items())))
    return replace(book, spares=spares)


def spare_promoted(book: Book, host: str, now: float, whole_world: bool = False) -> Book:
    """A spare of ``host`` was promoted at ``now``: its replacement waits
    ``SPARE_REFILL_DELAY``, or (``whole_world``: restart mode, where a whole world
    starts on the host and forms its process group) ``WORLD_SPARE_REFILL_DELAY``."""
    delay = WORLD_SPARE_REFILL_DELAY if whole_world else SPARE_REFILL_DELAY
    return _held(book, host, now + delay, now)


def spares_held_for_world(book: Book, hosts: Sequence[str], now: float) -> Book:
    """Restart mode: a world started at ``now`` on ``hosts``; no spare starts there for
    ``WORLD_SPARE_REFILL_DELAY`` (its workers are starting their program)."""
    for host in hosts:
        book = _held(book, host, now + WORLD_SPARE_REFILL_DELAY, now)
    return book


def spares_to_launch(
    workers: Workers,
    plan: Plan | None,
    usable: Sequence[HostSlots],
    book: Book,
    spares: int,
    now: float,
) -> list[Decision]:
    """A ``LaunchSpare`` for each spare missing on a usable host (lowest free index
    first), or a ``Wait`` while the host's spares are held; nothing before the first
    round, once training is done, or with no spares asked for."""
    if spares <= 0 or plan is None or book.training_done:
        return []
    used: dict[str, set[int]] = defaultdict(set)
    for r in workers.values():
        if r.spare and r.state.active:
            used[r.host].add(r.slot)
    holds = _holds(book, now)
    decisions: list[Decision] = []
    for h in usable:
        missing = [i for i in range(spares) if i not in used[h.host]]
        if not missing:
            continue
        if h.host in holds:
            decisions.append(Wait(holds[h.host], f"a spare on {h.host} to be started again"))
            continue
        decisions += [LaunchSpare(h.host, i) for i in missing]
    return decisions


def spares_to_stop(workers: Workers, usable: Sequence[HostSlots]) -> list[Decision]:
    """Stop the active spares whose host is not usable (gone, blacklisted, cooling
    down), and say so."""
    hosts = {h.host for h in usable}
    reason = "its host left the job"
    decisions: list[Decision] = []
    for r in workers.values():
        if r.spare and r.state.active and r.host not in hosts:
            event = WorkerStopping(worker=r.worker_id, host=r.host, slot=r.slot, reason=reason)
            decisions += [Report(event), Stop(r.worker_id, reason)]
    return decisions


def spare_exited(rec: WorkerRecord, code: int, book: Book, now: float) -> tuple[WorkerRecord, Step]:
    """The spare's process exited with ``code`` (see the module docstring): its new
    record, and the quiet decisions."""
    done = lifecycle.exited(rec, code, now)
    wid, host = rec.worker_id, rec.host
    if done.state is WorkerState.STOPPED:
        stopped = WorkerStopped(worker=wid, host=host, slot=rec.slot, code=code)
        return done, Step((Report(stopped),), book)
    event = SpareLost(worker=wid, host=host, code=code, registered=rec.ever_registered)
    decisions: list[Decision] = [Report(event)]
    if rec.kill_reason is None:
        decisions.append(CountFailure(host, code, streak=False))
    if not rec.ever_registered:
        book = _held(book, host, now + SPARE_RETRY_DELAY, now)
    return done, Step(tuple(decisions), book)


def spare_launch_failed(worker_id: str, host: str, reason: str, book: Book, now: float) -> Step:
    """A spare could not be started (``reason``: the launcher's error): lost before it
    registered (its host is held, and counts the failure), but no failure of the job."""
    event = SpareLost(worker=worker_id, host=host, code=None, registered=False, reason=reason)
    decisions = (Report(event), CountFailure(host, None, reason, streak=False))
    return Step(decisions, _held(book, host, now + SPARE_RETRY_DELAY, now))
