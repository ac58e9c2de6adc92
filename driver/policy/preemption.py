"""A host the scheduler takes back (its agent got SIGTERM): a snapshot first, then its
workers stop (pure).

* ``host_preempted``: with ``--checkpoint-dir``, when the host runs members of the
  round, the round is published again asking for a snapshot of the newest commit
  (``SnapshotNow``) and the host drains: its workers stop once that snapshot is complete
  (``drains_due``), or after ``DRAIN_WAIT`` at most. Without a checkpoint directory, or
  with no member there, they stop at once. Either way the host then counts as lost (its
  workers are dropped, their slots refilled elsewhere, the host out for its cooldown),
  as a host that does not answer a probe.
"""

from __future__ import annotations

from dataclasses import replace

from driver.events import HostPreempted, HostUnreachable
from driver.policy.decisions import Book, Decision, HostLost, Kill, Report, SnapshotNow, Step, Wait
from driver.policy.lifecycle import Workers
from rendezvous.plan import SNAPSHOT_NOW, Plan

DRAIN_WAIT = 20.0
"""Seconds a preempted host's workers wait for the snapshot before they stop anyway
(schedulers give a preempted process tens of seconds: Kubernetes 30 by default)."""


def _on_host(workers: Workers, host: str) -> list[str]:
    return sorted(r.worker_id for r in workers.values() if r.host == host and r.state.running)


def _lost(workers: Workers, host: str, detail: str) -> list[Decision]:
    gone = _on_host(workers, host)
    decisions: list[Decision] = [
        Report(HostUnreachable(host, detail, gone)),
        HostLost(host, detail),
    ]
    return decisions + [Kill(w, f"its host {host} was preempted") for w in gone]


def host_preempted(
    workers: Workers, plan: Plan | None, book: Book, host: str, snapshots: bool, now: float
) -> Step:
    """The agent of ``host`` got SIGTERM (see the module docstring)."""
    if any(h == host for h, _, _ in book.draining):
        return Step((), book)  # said already
    members = plan is not None and any(m.host == host for m in plan.members)
    drain = snapshots and members and plan is not None
    said = Report(HostPreempted(host, _on_host(workers, host), snapshot=drain))
    if not drain or plan is None:
        return Step((said, *_lost(workers, host, "preempted")), book)
    again = replace(plan, round_id=plan.round_id + 1, snapshot=SNAPSHOT_NOW)
    book = replace(book, draining=(*book.draining, (host, again.round_id, now + DRAIN_WAIT)))
    return Step((said, SnapshotNow(again)), book)


def drains_due(workers: Workers, book: Book, now: float) -> Step:
    """Stop the workers of each preempted host whose snapshot is complete, or whose wait
    is over; wait for the others."""
    decisions: list[Decision] = []
    kept = []
    for host, round_id, until in book.draining:
        if book.snapshot_round >= round_id or now >= until:
            why = (
                "preempted, after its snapshot" if book.snapshot_round >= round_id else "preempted"
            )
            decisions += _lost(workers, host, why)
        else:
            kept.append((host, round_id, until))
            decisions.append(Wait(until, f"the snapshot before {host} goes"))
    if len(kept) == len(book.draining):
        return Step(tuple(decisions), book)
    return Step(tuple(decisions), replace(book, draining=tuple(kept)))
