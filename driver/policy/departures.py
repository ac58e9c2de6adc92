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
* ``leaving_due``: a leaving worker still running at its deadline (its script commits
  rarely, or no round could form without it) is stopped; the others then lose at most
  the step in flight, as with any lost worker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from driver.policy.decisions import Book, Decision, Leave, Step, Stop, Wait
from driver.policy.lifecycle import Workers
from rendezvous.plan import Plan

LEAVE_WAIT = 15.0
"""Seconds a leaving worker has to reach its next commit and leave on its own before it
is stopped (a scheduler's grace is 30 s by default, Kubernetes' and Slurm's KillWait;
the agent's own drain ends 25 s after its SIGTERM)."""


def leave_at_commit(worker_ids: Iterable[str], reason: str, now: float) -> list[Decision]:
    """A ``Leave`` for each of ``worker_ids``, due ``LEAVE_WAIT`` after ``now``."""
    return [Leave(w, reason, now + LEAVE_WAIT) for w in worker_ids]


def is_handover(plan: Plan | None, candidate: Plan, workers: Workers, book: Book) -> bool:
    """Whether ``candidate`` takes over from ``plan`` at the members' next commit: every
    member of ``plan`` still runs, each one it drops is leaving (``Book.leaving``), and
    it keeps at least one (the state goes on with it). A round that only grows is one
    too: the newcomers wait for the others' next commit, as under Horovod."""
    if plan is None or plan.snapshot:
        return False
    kept = set(candidate.worker_ids)
    leaving = {w for w, _ in book.leaving}
    return (
        any(w in kept for w in plan.worker_ids)
        and all(w in workers and workers[w].state.running for w in plan.worker_ids)
        and all(w in kept or w in leaving for w in plan.worker_ids)
    )


def leaving_due(workers: Workers, book: Book, now: float) -> Step:
    """Forget the leaving workers that exited; stop those whose deadline passed; wait
    for the rest."""
    decisions: list[Decision] = []
    kept = []
    for worker_id, until in book.leaving:
        rec = workers.get(worker_id)
        if rec is None or not rec.state.running:
            continue
        if now >= until:
            decisions.append(
                Stop(worker_id, f"it did not leave at a commit within {LEAVE_WAIT:g}s")
            )
            continue
        kept.append((worker_id, until))
        decisions.append(Wait(until, f"{worker_id} to leave at its next commit"))
    if len(kept) == len(book.leaving):
        return Step(tuple(decisions), book)
    return Step(tuple(decisions), replace(book, leaving=tuple(kept)))
