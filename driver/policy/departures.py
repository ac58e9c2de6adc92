"""Workers that leave on purpose at their next commit: a handover instead of a loss (pure).

A host that leaves the job on purpose (SIGTERM to its agent: a scheduler's preemption, a
pod's deletion, a joined node's ``scancel``; or discovery removed it) does not need its
workers killed: they are alive and hold the newest commit like everyone else. So:

* ``leave_at_commit``: each member there gets a ``Leave`` (no signal: its exit, when it
  comes, is no failure) with a deadline ``LEAVE_WAIT`` away. Its process keeps training
  in the current round.
* ``is_handover``: the next round, without them, is published as a handover
  (``Plan.handover``) when every member it drops is such a leaving worker and every
  member still runs: the members finish the step in flight on the old ring and change
  rounds at their next commit, so no step is rolled back; the ones left out exit 0
  there. A round that only adds workers to an intact one is a handover too.
* ``state_holders``: leaving members go only once the state is safe without them: while
  no worker that stays is known to hold the newest commit (a world replaced whole:
  discovery swapped every host, every pod was deleted), they stay planned, on their
  departing hosts: the next round grows them by the newcomers (a handover: the
  newcomers get the state in its sync), and only once rank 0 has committed in a round
  the newcomers share is the round without them published (a handover again: they
  leave at that commit, nothing rolled back).
* ``leaving_due``: a leaving worker still running at its deadline (its script commits
  rarely, or no round could form without it) is stopped; the others then lose at most
  the step in flight, as with any lost worker. A whole world's holders wait
  ``HANDOFF_WAIT`` for newcomers; with ``--checkpoint-dir`` a snapshot of their commit
  is taken before they go.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import NamedTuple

from driver.hosts.slots import HostSlots
from driver.policy.decisions import Book, Decision, Leave, SnapshotNow, Step, Stop, Wait
from driver.policy.lifecycle import Workers
from driver.policy.memory.hosts import Drain
from rendezvous.schema.rounds import SNAPSHOT_NOW, Plan
from rendezvous.schema.workers import WorkerInfo

LEAVE_WAIT = 15.0
"""Seconds a leaving worker has to reach its next commit and leave on its own before it
is stopped (a scheduler's grace is 30 s by default, Kubernetes' and Slurm's KillWait;
the agent's own drain ends 25 s after its SIGTERM)."""


# (``driver.flags.HANDOFF_WAIT``: how long a whole world's holders wait for newcomers;
# said in ``--help``, so it lives with the flags' defaults.)


def leave_at_commit(
    worker_ids: Iterable[str], reason: str, now: float, wait: float = LEAVE_WAIT
) -> list[Decision]:
    """A ``Leave`` for each of ``worker_ids``, due ``wait`` after ``now``."""
    return [Leave(w, reason, now + wait) for w in worker_ids]


class Holders(NamedTuple):
    """Leaving members that the next round must keep (``state_holders``): their
    registrations, and the usable hosts with their slots added (the hosts and slots
    they leave), for the planner to place them on."""

    infos: tuple[WorkerInfo, ...]
    usable: tuple[HostSlots, ...]


def state_holders(
    plan: Plan | None,
    candidate: Plan | None,
    workers: Workers,
    book: Book,
    usable: Sequence[HostSlots],
) -> Holders | None:
    """The leaving members of ``plan`` that must stay planned because the state is not
    safe without them (see the module docstring): ``candidate`` (the round the usable
    hosts give) keeps, staying, none of the workers known to hold the newest commit
    (``ProgressBook.commit_members``: the members of the round rank 0 last committed in; a
    newcomer holds nothing until rank 0 commits in a round with it). None when none
    must: before anything was committed (there is no state to keep), and while no round
    could form without them anyway (``candidate`` None: the round waits for workers,
    up to ``--elastic-timeout``, as a broken one does)."""
    if plan is None or candidate is None or not book.hosts.leaving or book.progress.step is None:
        return None  # (no round without them yet: the round waits, as any broken one)
    leaving = book.hosts.leaving_ids()
    infos = []
    for member in plan.members:
        rec = workers.get(member.worker_id)
        if member.worker_id in leaving and rec is not None and rec.state.running and rec.info:
            infos.append(rec.info)
    if not infos:
        return None
    # Safe when the candidate keeps, staying, a worker known to hold the newest commit.
    kept = set(candidate.worker_ids) if candidate is not None else set()
    if any(w in kept and w not in leaving for w in book.progress.commit_members):
        return None
    slots = {h.host: h.slots for h in usable}
    for info in infos:  # (a host discovery dropped, or a slot it took away)
        slots[info.host] = max(slots.get(info.host, 0), info.slot + 1)
    return Holders(tuple(infos), tuple(HostSlots(h, n) for h, n in slots.items()))


def is_handover(plan: Plan | None, candidate: Plan, workers: Workers, book: Book) -> bool:
    """Whether ``candidate`` takes over from ``plan`` at the members' next commit: every
    member of ``plan`` still runs, each one it drops is leaving (``HostBook.leaving``), and
    it keeps at least one (the state goes on with it). A round that only grows is one
    too: the newcomers wait for the others' next commit, as under Horovod."""
    if plan is None or plan.snapshot:
        return False
    kept = set(candidate.worker_ids)
    leaving = book.hosts.leaving_ids()
    return (
        any(w in kept for w in plan.worker_ids)
        and all(w in workers and workers[w].state.running for w in plan.worker_ids)
        and all(w in kept or w in leaving for w in plan.worker_ids)
    )


def leaving_due(
    workers: Workers, book: Book, now: float, plan: Plan | None = None, snapshots: bool = False
) -> Step:
    """Forget the leaving workers that exited; stop those whose deadline passed; wait
    for the rest. When every member of ``plan`` is leaving and one is due, they hold
    the only copy of the state: with ``snapshots`` (``--checkpoint-dir``) the round is
    published again asking for a snapshot of it first (``SnapshotNow``), and they are
    stopped once it is complete (their hosts drain: ``policy.preemption.drains_due``)."""
    decisions: list[Decision] = []
    kept = []
    hb = book.hosts
    leaving = hb.leaving_ids()
    last_holders = plan is not None and all(w in leaving for w in plan.worker_ids)
    due = [d.worker_id for d in hb.leaving if now >= d.until and _running(workers, d.worker_id)]
    if due and last_holders and snapshots and plan is not None and not hb.draining:
        again = replace(plan, round_id=plan.round_id + 1, snapshot=SNAPSHOT_NOW)
        hosts = sorted({workers[w].host for w in plan.worker_ids if _running(workers, w)})
        until_snapshot = now + LEAVE_WAIT
        draining = tuple(Drain(h, again.round_id, until_snapshot) for h in hosts)
        return Step(
            (SnapshotNow(again),), replace(book, hosts=replace(hb, leaving=(), draining=draining))
        )
    for departure in hb.leaving:
        worker_id, until = departure
        rec = workers.get(worker_id)
        if rec is None or not rec.state.running:
            continue
        if now >= until:
            decisions.append(Stop(worker_id, "it did not leave at a commit in time"))
            continue
        kept.append(departure)
        decisions.append(Wait(until, f"{worker_id} to leave at its next commit"))
    if len(kept) == len(hb.leaving):
        return Step(tuple(decisions), book)
    return Step(tuple(decisions), replace(book, hosts=replace(hb, leaving=tuple(kept))))


def _running(workers: Workers, worker_id: str) -> bool:
    rec = workers.get(worker_id)
    return rec is not None and rec.state.running
