"""A host the scheduler takes back (its agent got SIGTERM): a handover when others go on,
else a snapshot first, then its workers stop (pure).

* ``host_preempted``: when members of the round run on other hosts, at least
  ``--min-np`` of them, the host's members leave at their next commit and the others
  go on without rolling back (``driver.policy.departures``); its other workers (spares,
  ones starting) stop now. Otherwise, with ``--checkpoint-dir`` and members there, the
  round is published again asking for a snapshot of the newest commit
  (``SnapshotNow``) and the host drains: its workers stop once that snapshot is complete
  (``drains_due``), or after ``DRAIN_WAIT`` at most. Without a checkpoint directory, or
  with no member there, they stop at once. Either way the host then counts as lost (its
  slots are not refilled, the host out for its cooldown), as a host that does not
  answer a probe.
"""

from __future__ import annotations

from dataclasses import replace

from driver.events import HostPreempted, HostUnreachable
from driver.policy.decisions import (
    Book,
    Decision,
    HostLost,
    Kill,
    Report,
    SnapshotNow,
    Step,
    Stop,
    Wait,
)
from driver.policy.departures import leave_at_commit
from driver.policy.lifecycle import Workers
from driver.policy.memory.hosts import Drain
from rendezvous.schema.rounds import SNAPSHOT_NOW, Plan

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
    workers: Workers,
    plan: Plan | None,
    book: Book,
    host: str,
    snapshots: bool,
    now: float,
    min_np: int = 1,
) -> Step:
    """The agent of ``host`` got SIGTERM (see the module docstring)."""
    leaving = book.hosts.leaving_ids()
    if any(d.host == host for d in book.hosts.draining) or any(
        workers[w].host == host for w in leaving if w in workers
    ):
        return Step((), book)  # said already
    active = [
        m
        for m in (plan.members if plan is not None else ())
        if m.worker_id in workers and workers[m.worker_id].state.active
    ]
    here = [m.worker_id for m in active if m.host == host]
    others = [m.worker_id for m in active if m.host != host]
    if here and len(others) >= max(1, min_np):
        rest = [w for w in _on_host(workers, host) if w not in here]
        handover: list[Decision] = [
            Report(HostPreempted(host, _on_host(workers, host), snapshot=False, handover=True)),
            HostLost(host, "preempted"),
            *leave_at_commit(here, f"its host {host} is drained", now),
            *(Stop(w, f"its host {host} is drained") for w in rest),
        ]
        return Step(tuple(handover), book)
    members = bool(here)
    drain = snapshots and members and plan is not None
    said = Report(HostPreempted(host, _on_host(workers, host), snapshot=drain))
    if not drain or plan is None:
        return Step((said, *_lost(workers, host, "preempted")), book)
    again = replace(plan, round_id=plan.round_id + 1, snapshot=SNAPSHOT_NOW)
    draining = (*book.hosts.draining, Drain(host, again.round_id, now + DRAIN_WAIT))
    book = replace(book, hosts=replace(book.hosts, draining=draining))
    return Step((said, SnapshotNow(again)), book)


def drains_due(workers: Workers, book: Book, now: float) -> Step:
    """Stop the workers of each preempted host whose snapshot is complete, or whose wait
    is over; wait for the others."""
    decisions: list[Decision] = []
    kept = []
    done = book.progress.snapshot_round
    for drain in book.hosts.draining:
        host, round_id, until = drain
        if done >= round_id or now >= until:
            why = "preempted, after its snapshot" if done >= round_id else "preempted"
            decisions += _lost(workers, host, why)
        else:
            kept.append(drain)
            decisions.append(Wait(until, f"the snapshot before {host} goes"))
    if len(kept) == len(book.hosts.draining):
        return Step(tuple(decisions), book)
    return Step(tuple(decisions), replace(book, hosts=replace(book.hosts, draining=tuple(kept))))
