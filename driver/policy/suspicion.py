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

A silent rank 0 (``silent_rank0``): rank 0 writes its progress every report period from
a thread of its own, whatever its training does (a collective that waits, a ring being
built), so a rank 0 of the current round that the driver has not heard for
``rank0_silence_after`` (the workers' ``ELASTIC_PEER_TIMEOUT``, ``RANK0_SILENT_MIN`` at
least) is stopped or hung, and is killed. Its peers' word may never come: the
neighbours of a stopped member wait in the next round's setup for it to connect
(``ELASTIC_CONNECT_TIMEOUT``), silent meanwhile to their other neighbours, which report
them; each is killed in its turn, a newcomer refills its slot, the round forms again
around the stopped member, and the job stalls for good (and a report that named it
may come in a round that a handover replaced: it accuses nobody).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from driver.events import FailureReported, HostUnreachable
from driver.policy.decisions import Book, Decision, HostLost, Kill, Probe, Report, Step, Wait
from driver.policy.lifecycle import Workers
from driver.policy.memory.failures import Accusation, FailureBook
from rendezvous import env
from rendezvous.errors import RendezvousConfigError
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
    if plan is None or not _of_the_running_ring(report, plan, book.failures):
        return Step(decisions, book)
    if book.training_done:
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


def _of_the_running_ring(report: FailureRecord, plan: Plan, fb: FailureBook) -> bool:
    """Whether ``report`` is of the ring the members of ``plan`` train on: ``plan``'s
    own, or, while ``plan`` is a handover (its members change rounds at their next
    commit), a round from ``FailureBook.ring_round`` on. A member that stopped as a
    handover was published (a round grown by newcomers) is reported on the old ring;
    dropped, that report would leave it unblamed, and in the new round its neighbours,
    waiting for it to connect, are the ones their peers report silent."""
    if report.round_id == plan.round_id:
        return True
    return plan.handover and 0 < fb.ring_round <= report.round_id < plan.round_id


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


#: the least silence of rank 0 (seconds without its progress record) that kills it: ten
#: report periods, a store's bad moment and a loaded machine's included
RANK0_SILENT_MIN = 10.0
#: the workers' ``ELASTIC_PEER_TIMEOUT`` when the variable is not set (``elastic.runtime``)
PEER_TIMEOUT_DEFAULT = 30.0


def rank0_silence_after(environ: Mapping[str, str]) -> float:
    """Seconds without rank 0's progress after which it is killed (``silent_rank0``):
    the silence after which its ring peers take it as lost (the workers'
    ``ELASTIC_PEER_TIMEOUT``, from ``environ``, the environment they inherit), and
    ``RANK0_SILENT_MIN`` at least. An unreadable value is the workers' to report."""
    try:
        peer_timeout = env.tuned(env.ENV_PEER_TIMEOUT, PEER_TIMEOUT_DEFAULT, environ)
    except RendezvousConfigError:
        peer_timeout = PEER_TIMEOUT_DEFAULT
    return max(RANK0_SILENT_MIN, peer_timeout)


def silent_rank0(
    workers: Workers,
    plan: Plan | None,
    book: Book,
    now: float,
    after: float,
    store_trouble_at: float | None = None,
) -> Step:
    """Kill rank 0 of ``plan`` when it wrote the last progress record heard
    (``ProgressBook.writer``), is still active, and has not been heard for ``after``
    seconds: its progress thread, which writes whatever the training does, stopped (see
    the module docstring). Else wait for that moment. The silence counts from the
    latest moment the store did not answer the driver in time (``store_trouble_at``) at
    the earliest: a store that stalls holds every record back, and its watch brings
    them again once it answers. Nothing once the training is done
    (a finisher runs the script's end), and nothing for a rank 0 that has not written
    yet (a new rank 0 writes once its round is built)."""
    pb = book.progress
    if plan is None or not plan.members or book.training_done or pb.at is None:
        return Step((), book)
    writer = pb.writer
    if not writer or min(plan.members, key=lambda m: m.rank).worker_id != writer:
        return Step((), book)
    rec = workers.get(writer)
    if rec is None or not rec.state.active:
        return Step((), book)
    heard = pb.at if store_trouble_at is None else max(pb.at, store_trouble_at)
    quiet = now - heard
    if quiet < after:
        return Step((Wait(heard + after, f"rank 0 ({writer}) to be heard"),), book)
    reason = (
        f"unresponsive: rank 0 of round {plan.round_id}, its progress not heard for "
        f"{now - pb.at:.0f} s (stopped or hung)"
    )
    return Step((Kill(writer, reason),), book)
