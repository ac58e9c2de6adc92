"""Who is dead: the rules that turn workers' failure reports into kills (pure).

A worker that sees a collective fail reports it, naming the peer it blames when it saw
that peer stop answering itself (``failure_reported``). Peers' word is not proof: two
healthy workers kept apart (strangers crowding a listener, a one-way network fault)
blame each other, and killing on the first report would kill a holder of the newest
commit. So an accused worker of the current round is killed only when it stays silent
itself for ``CONFIRM_WINDOW`` (``accusations_due``): a stopped or hung process cannot
report, a live one in a broken round reports its own failure at about the same moment,
and a worker that reported is never killed on its peers' word in that round.

A silent peer (``silence_reported``, ``probe_answered``): a worker that a ring
neighbour has not heard from for a moment is not killed on that word alone (a busy
process is not dead, and a SIGSTOPped one is handled after ``peer_timeout``); its host
is asked once, by a connection attempt (``driver.hosts.probe``). A host that does not answer
is lost: its workers are killed (their slots refilled elsewhere, the round re-formed
without them at once) and the host blacklisted for its cooldown.
"""

from __future__ import annotations

from dataclasses import replace

from driver.events import FailureReported, HostUnreachable
from driver.policy.decisions import Book, Decision, HostLost, Kill, Probe, Report, Step, Wait
from driver.policy.lifecycle import Workers
from driver.policy.memory.failures import Accusation
from rendezvous.schema.rounds import Plan
from rendezvous.schema.workers import FailureRecord


def _report_event(report: FailureRecord) -> Report:
    """The ``failure_reported`` event of a worker's report, to emit."""
    return Report(
        FailureReported(
            reporter=report.worker_id,
            round=report.round_id,
            reason=report.reason,
            suspect=report.suspect,
        )
    )


#: seconds an accused worker has to show it is alive by reporting itself before it is
#: killed on its peers' word (reports of one broken round arrive within milliseconds of
#: each other; a stopped process never reports)
CONFIRM_WINDOW = 2.0


def failure_reported(
    workers: Workers, plan: Plan | None, book: Book, report: FailureRecord, now: float
) -> Step:
    """A worker's failure report: say so. A report of the current round clears its
    reporter of any accusation (it is alive); one naming an active worker that has not
    reported itself accuses it (see the module docstring)."""
    reporter = report.worker_id
    decisions: tuple[Decision, ...] = (_report_event(report),)
    # Once the training is done nobody is accused: the peer that went quiet may be a
    # finisher running the script's end, which must not be killed for it.
    if plan is None or report.round_id != plan.round_id or book.training_done:
        return Step(decisions, book)
    fb = book.failures
    reporters = fb.reporters | {reporter}
    accused = tuple(a for a in fb.accused if a.worker_id not in reporters)
    rec = workers.get(report.suspect) if report.suspect is not None else None
    if (
        rec is not None
        and rec.state.active
        and rec.worker_id not in reporters
        and all(a.worker_id != rec.worker_id for a in accused)
    ):
        accused += (Accusation(rec.worker_id, now, f"reported by {reporter}: {report.reason}"),)
    fb = replace(fb, reporters=frozenset(reporters), accused=accused)
    return Step(decisions, replace(book, failures=fb))


def accusations_due(workers: Workers, book: Book, now: float) -> Step:
    """Kill each accused worker that stayed silent for ``CONFIRM_WINDOW`` and is still
    active; wait for the others."""
    decisions: list[Decision] = []
    kept = []
    for accusation in book.failures.accused:
        worker_id, since, why = accusation
        rec = workers.get(worker_id)
        if rec is None or not rec.state.active:
            continue
        if now - since >= CONFIRM_WINDOW:
            decisions.append(
                Kill(
                    worker_id,
                    f"unresponsive: {why}; it reported nothing itself for {CONFIRM_WINDOW:g} s",
                )
            )
        else:
            kept.append(accusation)
            decisions.append(Wait(since + CONFIRM_WINDOW, f"{worker_id} to show it is alive"))
    return Step(
        tuple(decisions), replace(book, failures=replace(book.failures, accused=tuple(kept)))
    )


def silence_reported(
    workers: Workers, plan: Plan | None, book: Book, report: FailureRecord
) -> Step:
    """A member of the current round reports a neighbour it has not heard from for a
    moment (``report.silent``): probe that neighbour's host once, unless a probe of it
    is already under way. Reports about older rounds or inactive workers are noted
    only."""
    decisions: list[Decision] = [_report_event(report)]
    rec = workers.get(report.suspect) if report.suspect is not None else None
    current = plan is not None and report.round_id == plan.round_id
    if not current or book.training_done or rec is None or not rec.state.active or rec.info is None:
        return Step(tuple(decisions), book)
    fb = book.failures
    if rec.host in fb.probing:
        return Step(tuple(decisions), book)
    decisions.append(Probe(rec.host, rec.info.address))
    return Step(
        tuple(decisions), replace(book, failures=replace(fb, probing=fb.probing | {rec.host}))
    )


def probe_answered(workers: Workers, book: Book, host: str, reachable: bool, detail: str) -> Step:
    """The probe of ``host`` came back: nothing to do if it answered; else the host is
    lost with every worker still running there."""
    fb = book.failures
    book = replace(book, failures=replace(fb, probing=fb.probing - {host}))
    if reachable:
        return Step((), book)
    lost = sorted(r.worker_id for r in workers.values() if r.host == host and r.state.running)
    decisions: list[Decision] = [
        Report(HostUnreachable(host, detail, lost)),
        HostLost(host, detail),
    ]
    decisions += [Kill(w, f"its host {host} is unreachable ({detail})") for w in lost]
    return Step(tuple(decisions), book)
