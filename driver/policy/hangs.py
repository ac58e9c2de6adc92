"""Hung workers (``--hang-timeout``): a worker's own report that its training is hung
turned into a kill (pure).

Each worker's hang watchdog (``elastic.hangs``) reports, under ``JobKeys.hung``, when its
training function went longer than its hang timeout without reaching a collective or a
commit while its process lives: a deadlocked data loader, a ``while True`` in user
code, a call that never returns. Its heartbeats still answer, so neither the ring's
silence rule nor a probe would ever find it, and its peers would wait in their
collective for as long as it hangs. The report is the proof (the worker says it of
itself, so no confirmation window is needed, unlike a peer's accusation in
``driver.policy.suspicion``): the driver says ``hung`` with every thread's stack and
kills it; its exit is a lost worker's (a failure, a strike against its host), its
peers' pending collective raises as its sockets close, and the round re-forms without
it, a replacement or a spare taking its slot.

A report of a worker the driver no longer counts on (exited, being stopped, killed
already: a report read again after a takeover) is ignored. So is none of the others:
a worker hung after the training finished still holds the job's end, and its kill
fails nothing then (``driver.policy.exits``).
"""

from __future__ import annotations

from driver.events import WorkerHung
from driver.policy.decisions import Decision, Kill, Report
from driver.policy.lifecycle import Workers
from rendezvous.schema.rounds import Plan
from rendezvous.schema.workers import FailureRecord


def hang_reported(
    workers: Workers, plan: Plan | None, report: FailureRecord
) -> tuple[Decision, ...]:
    """Worker ``report.worker_id`` says its training is hung (``report.hung``): say so
    (``hung``, with its stacks) and kill it, unless the driver gave up on it already."""
    rec = workers.get(report.worker_id)
    if rec is None or not rec.state.active:
        return ()
    member = plan.member(rec.worker_id) if plan is not None else None
    event = WorkerHung(
        worker=rec.worker_id,
        host=rec.host,
        slot=rec.slot,
        rank=member.rank if member is not None else None,
        round=report.round_id,
        reason=report.reason,
        stacks=report.stacks,
    )
    return (Report(event), Kill(rec.worker_id, f"hung: {report.reason}"))
