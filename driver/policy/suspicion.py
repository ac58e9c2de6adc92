"""Who is dead: the rules that turn workers' failure reports into kills (pure).

A worker that sees a collective fail reports it, naming the peer it blames when it saw
that peer stop answering itself (``failure_reported``): peers of the current round
naming an active worker get it killed (it is alive but not answering: stopped, hung).

A silent peer (``silence_reported``, ``probe_answered``): a worker that a ring
neighbour has not heard from for a moment is not killed on that word alone (a busy
process is not dead, and a SIGSTOPped one is handled after ``peer_timeout``); its host
is asked once, by a connection attempt (``driver.probe``). A host that does not answer
is lost: its workers are killed (their slots refilled elsewhere, the round re-formed
without them at once) and the host blacklisted for its cooldown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from driver.decisions import Book, Decision, HostLost, Kill, Probe, Report, Step
from driver.events import FailureReported, HostUnreachable
from driver.workers import Workers
from rendezvous.plan import Plan


def _report_event(report: Mapping[str, Any]) -> Report:
    """The ``failure_reported`` event of a worker's report, to emit."""
    return Report(
        FailureReported(
            reporter=report.get("worker_id"),
            round=report.get("round_id"),
            reason=report.get("reason"),
            suspect=report.get("suspect"),
        )
    )


def failure_reported(
    workers: Workers, plan: Plan | None, report: Mapping[str, Any]
) -> list[Decision]:
    """A worker's failure report (``worker_id``, ``round_id``, ``reason``, ``suspect``):
    say so, and when peers of the current round name an active worker, kill it (it is
    alive but not answering: stopped, hung)."""
    suspect, round_id = report.get("suspect"), report.get("round_id")
    decisions: list[Decision] = [_report_event(report)]
    rec = workers.get(suspect) if isinstance(suspect, str) else None
    if plan is not None and round_id == plan.round_id and rec is not None and rec.state.active:
        decisions.append(Kill(rec.worker_id, "unresponsive (reported by its peers)"))
    return decisions


def silence_reported(
    workers: Workers, plan: Plan | None, book: Book, report: Mapping[str, Any]
) -> Step:
    """A member of the current round reports a neighbour it has not heard from for a
    moment (``report["silent"]``): probe that neighbour's host once, unless a probe of
    it is already under way. Reports about older rounds or inactive workers are noted
    only."""
    suspect, round_id = report.get("suspect"), report.get("round_id")
    decisions: list[Decision] = [_report_event(report)]
    rec = workers.get(suspect) if isinstance(suspect, str) else None
    current = plan is not None and round_id == plan.round_id
    if not current or rec is None or not rec.state.active or rec.info is None:
        return Step(tuple(decisions), book)
    if rec.host in book.probing:
        return Step(tuple(decisions), book)
    decisions.append(Probe(rec.host, rec.info.address))
    return Step(tuple(decisions), replace(book, probing=book.probing | {rec.host}))


def probe_answered(workers: Workers, book: Book, host: str, reachable: bool, detail: str) -> Step:
    """The probe of ``host`` came back: nothing to do if it answered; else the host is
    lost with every worker still running there."""
    book = replace(book, probing=book.probing - {host})
    if reachable:
        return Step((), book)
    lost = sorted(r.worker_id for r in workers.values() if r.host == host and r.state.running)
    decisions: list[Decision] = [
        Report(HostUnreachable(host, detail, lost)),
        HostLost(host, detail),
    ]
    decisions += [Kill(w, f"its host {host} is unreachable ({detail})") for w in lost]
    return Step(tuple(decisions), book)
