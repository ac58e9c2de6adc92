"""When to publish the next round, wait, or give up: the round rules and their timers (pure).

``plan_round`` is asked after every message the loop handles: it returns ``Publish``,
the ``Wait``s that say when to look again, or ``Fail``; ``next_wakeup`` turns every
rule's waits into the loop's next sleep. Apart from the exit rules
(``driver.policy.exits``): these look at the membership as a whole and at how long it
has been waiting, not at one worker.

The rules:

* First round (``plan_round``): wait for ``-np`` registered workers, up to
  ``--start-timeout``; once there are, wait ``FIRST_ROUND_GRACE`` for the rest of those
  launched (spares aside), so a job on 8 slots forms one round of 8.
* Training done: once a worker's ``@elastic.run`` function returned (it says so in the
  store: ``JobKeys.training_finished``, which the driver follows), no round forms again:
  the others finish as they are, whatever the time they take, or are told the training
  is done (a re-formed round at the end would hand a finished job to a new world). The store enforces it: a round is published only while
  ``JobKeys.training_finished`` does not exist, and a worker records its finish only
  while the round key is still its round (else it joins the newer round).
* Finish grace: after a member exits 0 without saying so, no round for ``FINISH_GRACE`` (the others are
  most likely finishing too).
* Join batch window: a bigger round waits while workers launched less than
  ``JOIN_BATCH_WINDOW`` ago have not registered, if the current round still works
  (spares are no joiners: a promoted one is registered already, one starting is for
  later).
* Broken round (``plan_round``): a round that lost members and cannot re-form is
  reported after ``WAITING_REPORT_AFTER`` and ends the job after ``--elastic-timeout``.
* Handover (``driver.policy.departures``): a round that only drops workers leaving on
  purpose (a drained host's) is published as a handover: its members change rounds at
  their next commit, with nothing rolled back.
* Reset limit: publishing a round beyond ``--reset-limit`` re-forms ends the job
  (rounds after a worker finished are not resets).
* The script fails everywhere (``script_fails``): every member of two rounds in a row
  exited with an error code of its own (no signal, no stop) ends the job; one such
  round is replaced as usual (with -np 1 it is just a failed worker).
* Lost rounds (``rounds_lost``): ``LOST_ROUNDS_LIMIT`` rounds in a row whose members
  all died on their own, by any code or signal, end the job.
* State lost (``_publish``): a round with no member of the round before it, once the
  workers commit a state (rank 0's progress says so), finds that state only in a
  snapshot. One its members can read (``--checkpoint-dir``: a snapshot every member
  sees, or one on a member's host) carries it on: the round resumes from it. Without
  one the job ends, naming the last committed step lost, unless
  ``--on-state-lost restart`` asked to start over (then ``StateLost`` says so).
* Wake-up (``next_wakeup``): the earliest ``Wait``, at most ``MAX_SLEEP`` away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from driver.config import JobConfig
from driver.events import StateLost, Waiting, describe_code
from driver.hosts.slots import HostSlots
from driver.policy import departures, planner
from driver.policy.decisions import Book, Decision, Fail, HostsView, Publish, Report, Step, Wait
from driver.policy.lifecycle import WorkerRecord, Workers, WorkerState
from driver.policy.memory.failures import FailureBook
from rendezvous.schema.rounds import Plan
from rendezvous.schema.workers import WorkerInfo

#: after the first ``-np`` workers registered, how long to wait for the rest of those
#: launched before the first round (so a job starting on 8 slots forms one round of 8)
FIRST_ROUND_GRACE = 1.0
#: how long a broken round may wait before a ``waiting`` event says so (a worker that
#: finishes first leaves its round broken for a moment: no need to report that)
WAITING_REPORT_AFTER = 1.0
#: after a member of the round exits 0, how long to wait before re-forming without it:
#: at the end of training the others exit too, and a round for that moment is noise
FINISH_GRACE = 2.0
#: workers launched together join in one re-form if they register within this window
JOIN_BATCH_WINDOW = 3.0
#: rounds in a row whose members all died on their own (any code or signal, none stopped
#: or killed by the driver or the chaos) that end the job: each time the job started
#: over from nothing, and it would again (a worker that always crashes at its end)
LOST_ROUNDS_LIMIT = 3
#: while leaving workers hold the only copy of the state, how often the rules look
#: whether a round without them may form (rank 0's commit in the newcomers' round)
HOLD_LOOK = 0.25
#: the loop looks at the job at least this often, whatever it waits for
MAX_SLEEP = 1.0
MIN_SLEEP = 0.01


@dataclass(frozen=True)
class RoundSettings:
    """What the round rules read of the job's configuration (restart mode's world
    rules too, ``driver.policy.restarts``; and the wait for blacklisted hosts,
    ``driver.policy.occupancy.hosts_rule``): the sizes, the timeouts, the reset limit,
    and what becomes of a lost state."""

    np: int
    min_np: int
    max_np: int | None
    start_timeout: float
    elastic_timeout: float
    reset_limit: int | None
    on_state_lost: str = "fail"
    checkpoint_dir: str | None = None

    @classmethod
    def from_config(cls, config: JobConfig) -> RoundSettings:
        return cls(
            np=config.np,
            min_np=config.min_np,
            max_np=config.max_np,
            start_timeout=config.start_timeout,
            elastic_timeout=config.elastic_timeout,
            reset_limit=config.reset_limit,
            on_state_lost=config.on_state_lost,
            checkpoint_dir=config.checkpoint_dir,
        )


def live_infos(workers: Workers) -> list[WorkerInfo]:
    """Registrations of the live workers, in registration order (what the planner takes)."""
    live = sorted(
        (r for r in workers.values() if r.live and r.info is not None),
        key=lambda r: r.registered_seq,
    )
    return [r.info for r in live if r.info is not None]


def plan_round(
    workers: Workers,
    plan: Plan | None,
    book: Book,
    hosts: HostsView,
    config: RoundSettings,
    now: float,
) -> Step:
    """Whether to publish a round now, wait, or give up (see the module docstring)."""
    rb = book.rounds
    if rb.training_done:
        return Step((), book)
    if rb.member_finished_at is not None and now - rb.member_finished_at < FINISH_GRACE:
        return Step((Wait(rb.member_finished_at + FINISH_GRACE, "the others to finish"),), book)
    live = live_infos(workers)
    if plan is None:
        if len(live) < config.np:
            book = replace(book, rounds=replace(rb, np_registered_at=None))
            if now - rb.started_at > config.start_timeout:
                return Step(
                    (Fail(_start_timeout_reason(len(live), book, config, now)),),
                    book,
                )
            return Step((Wait(rb.started_at + config.start_timeout, "-np workers"),), book)
        registered_at = rb.np_registered_at if rb.np_registered_at is not None else now
        book = replace(book, rounds=replace(rb, np_registered_at=registered_at))
        launched = sum(1 for r in workers.values() if r.state.active and not r.spare)
        grace_end = registered_at + FIRST_ROUND_GRACE
        if len(live) < launched and now < grace_end:
            return Step((Wait(grace_end, "the rest of the first workers"),), book)
        min_np = config.np
    else:
        min_np = config.min_np
    usable: Sequence[HostSlots] = hosts.usable
    candidate = planner.next_plan(plan, live, usable, min_np, config.max_np)
    decisions: list[Decision] = []
    holders = departures.state_holders(plan, candidate, workers, book, usable)
    if holders is not None:
        # The state is not safe without its leaving holders yet: plan them on their
        # departing hosts, so the next round grows them by the newcomers, and look again
        # once rank 0 commits in it.
        live, usable = [*holders.infos, *live], holders.usable
        max_np = config.max_np + len(holders.infos) if config.max_np is not None else None
        candidate = planner.next_plan(plan, live, usable, min_np, max_np)
        decisions.append(Wait(now + HOLD_LOOK, "the newcomers to hold the state"))
    intact = plan is not None and planner.round_is_intact(plan, live, usable)
    if candidate is not None and planner.needs_new_round(plan, candidate):
        joiners = [
            r.launched_at
            for r in workers.values()
            if r.state in (WorkerState.LAUNCHED, WorkerState.UNREGISTERED) and not r.spare
        ]
        if not planner.hold_growth_for_joiners(
            intact, [now - t for t in joiners], JOIN_BATCH_WINDOW
        ):
            if departures.is_handover(plan, candidate, workers, book):
                candidate = replace(candidate, handover=True)
            return _publish(candidate, plan, book, workers, config, now)
        decisions.append(Wait(max(joiners) + JOIN_BATCH_WINDOW, "new workers to register"))
    if plan is None:
        return Step(tuple(decisions), book)
    if intact:
        rb = replace(book.rounds, broken_since=None)  # a lapse is over
        return Step(tuple(decisions), replace(book, rounds=rb))
    return _broken(workers, plan, book, len(live), min_np, hosts, config, now)


def _publish(
    candidate: Plan,
    plan: Plan | None,
    book: Book,
    workers: Workers,
    config: RoundSettings,
    now: float,
) -> Step:
    rb = book.rounds
    resets = rb.resets
    if plan is not None and not rb.done_slots:
        # (Rounds for stragglers after a member finished are not resets.)
        resets += 1
        if config.reset_limit is not None and resets > config.reset_limit:
            return Step(
                (
                    Fail(
                        f"reset limit exceeded: the job re-formed {resets} times "
                        f"(--reset-limit {config.reset_limit})"
                    ),
                ),
                book,
            )
    took = now - (rb.change_at if rb.change_at is not None else now)
    book = replace(
        book,
        rounds=replace(rb, resets=resets, broken_since=None, change_at=None),
        failures=replace(book.failures, streak=0),
    )
    decisions: list[Decision] = [Publish(candidate, round(took, 3))]
    if plan is not None and not set(plan.worker_ids) & set(candidate.worker_ids):
        lost = _state_lost(candidate, plan, book, config)
        if isinstance(lost, Fail):
            # The cause, when it is the script, not only what it cost.
            return Step((_script_failed_round(workers, plan) or lost,), book)
        decisions += lost
    return Step(tuple(decisions), book)


def _state_lost(
    candidate: Plan, plan: Plan, book: Book, config: RoundSettings
) -> Fail | list[Decision]:
    """``candidate`` has no member of ``plan``: what becomes of the state they committed
    (see the module docstring)."""
    step, snapshots = book.progress.step, book.progress.snapshots
    if step is None:
        return []  # nothing committed that anyone knows of: nothing to lose
    hosts = {m.host for m in candidate.members}
    if any(s.host == "" or s.host in hosts for s in snapshots):
        return []  # the round's sync resumes from the snapshot (its reader says so)
    if config.on_state_lost == "restart":
        return [Report(StateLost(round=candidate.round_id, previous=plan.round_id, step=step))]
    way_out = "start it again with --checkpoint-dir to keep it"
    if not config.checkpoint_dir:
        where = "there is no --checkpoint-dir"
    elif snapshots:  # on disks only other hosts are known to read (host-local, or alone)
        where = (
            "its snapshots are on hosts the new round does not run on ("
            + ", ".join(sorted({s.host for s in snapshots}))
            + ")"
        )
        way_out = "the same command started where they are resumes from the newest"
    else:
        where = "no snapshot holds it yet"
        way_out = "a shorter --checkpoint-interval keeps it sooner"
    return Fail(
        f"the committed training state was lost: no worker of round {plan.round_id} is left "
        f"to hand it on (it had committed step {step} at least, as rank 0 last said) and "
        f"{where}; {way_out}, or --on-state-lost restart trains from the script's "
        "initial state"
    )


def _broken(
    workers: Workers,
    plan: Plan,
    book: Book,
    have: int,
    min_np: int,
    hosts: HostsView,
    config: RoundSettings,
    now: float,
) -> Step:
    """The round lost members and no plan of ``min_np`` can form yet."""
    failures, failed = script_fails(workers, plan, book.failures)
    if failed is None:
        failures, failed = rounds_lost(workers, plan, failures)
    book = replace(book, failures=failures)
    if failed is not None:
        return Step((failed,), book)
    what = f"round {plan.round_id} lost workers; waiting for {min_np} to re-form (have {have})"
    return waiting_for(what, "round", have, min_np, book, hosts, config, now)


def waiting_for(
    what: str,
    unit: str,
    have: int,
    min_np: int,
    book: Book,
    hosts: HostsView,
    config: RoundSettings,
    now: float,
) -> Step:
    """Fewer than ``min_np`` workers (``have``) can be in the job's next ``unit`` (a
    round, or a world of restart mode) since ``RoundBook.broken_since``: say ``what`` is
    waited for once the wait passed ``WAITING_REPORT_AFTER``, and end the job after
    ``--elastic-timeout``."""
    decisions: list[Decision] = []
    rb = book.rounds
    if rb.broken_since is None:
        rb = replace(rb, broken_since=now, waiting_reported=False)
    since = rb.broken_since if rb.broken_since is not None else now
    if not rb.waiting_reported:
        if now - since > WAITING_REPORT_AFTER:
            rb = replace(rb, waiting_reported=True)
            decisions.append(Report(Waiting(what=what, waited=round(now - since, 3))))
        else:
            decisions.append(Wait(since + WAITING_REPORT_AFTER, f"a {unit} to re-form"))
    if now - since > config.elastic_timeout:
        blacklisted = hosts.blacklisted
        decisions.append(
            Fail(
                f"no {unit} of at least {min_np} workers could form within "
                f"--elastic-timeout {config.elastic_timeout:g}s (have {have}"
                + (f"; blacklisted: {', '.join(blacklisted)}" if blacklisted else "")
                + _no_hosts_note(book, now)
                + ")"
            )
        )
    else:
        decisions.append(Wait(since + config.elastic_timeout, "--elastic-timeout"))
    return Step(tuple(decisions), replace(book, rounds=rb))


def _script_failed_round(workers: Workers, plan: Plan) -> Fail | None:
    """Every member of ``plan`` exited with an error code of its own (no signal, no
    stop), and its committed state went with them: the reason is the script failing,
    said as such (what it cost, the state, follows in the same line)."""
    members = [workers[m.worker_id] for m in plan.members if m.worker_id in workers]
    if not members or not all(_own_error(r) for r in members):
        return None
    codes = sorted({r.exit_code for r in members if r.exit_code is not None})
    return Fail(
        f"every worker of round {plan.round_id} exited with an error (codes {codes}): the "
        "training script fails; see the worker output above (the state they had committed "
        "went with them)"
    )


def _own_error(r: WorkerRecord) -> bool:
    return r.state is WorkerState.FAILED and r.exit_code is not None and r.exit_code > 0


def script_fails(
    workers: Workers, plan: Plan, book: FailureBook
) -> tuple[FailureBook, Fail | None]:
    """Every member of two rounds in a row exited with an error code of its own (no
    signal, no stop): the script fails deterministically, and replacing the workers
    again would only repeat it. The book remembers rounds whose members all failed."""
    members = [workers[m.worker_id] for m in plan.members]
    if not members or not all(_own_error(r) for r in members):
        return book, None
    book = replace(book, all_failed_rounds=book.all_failed_rounds | {plan.round_id})
    if plan.round_id - 1 not in book.all_failed_rounds:
        return book, None
    codes = sorted({r.exit_code for r in members if r.exit_code is not None})
    return book, Fail(
        f"every worker of rounds {plan.round_id - 1} and {plan.round_id} exited "
        f"with an error (codes {codes}): the training script fails; see the "
        "worker output above"
    )


def rounds_lost(workers: Workers, plan: Plan, book: FailureBook) -> tuple[FailureBook, Fail | None]:
    """Every member of ``LOST_ROUNDS_LIMIT`` rounds in a row died on its own, whatever
    its code or signal (a script that aborts at its end, a crash at exit): the job
    started over from nothing each time, and would again. (``script_fails`` ends it
    sooner when the codes are the script's own errors.) The book remembers such rounds."""
    members = [workers[m.worker_id] for m in plan.members]
    if not members or not all(r.died_on_its_own for r in members):
        return book, None
    book = replace(book, lost_rounds=book.lost_rounds | {plan.round_id})
    first = plan.round_id - LOST_ROUNDS_LIMIT + 1
    if first < 1 or not all(r in book.lost_rounds for r in range(first, plan.round_id)):
        return book, None
    codes = sorted({describe_code(r.exit_code) for r in members})
    return book, Fail(
        f"every worker of rounds {first} to {plan.round_id} died ({', '.join(codes)}) "
        "with no survivor to hand the training state on: the job started over "
        f"{LOST_ROUNDS_LIMIT} times in a row; see the worker output above"
    )


def _start_timeout_reason(registered: int, book: Book, config: RoundSettings, now: float) -> str:
    timeout = f"--start-timeout {config.start_timeout:g}s"
    since = book.hosts.no_hosts_since
    if since is not None and registered == 0:
        return (
            f"discovery has listed no host for {now - since:.0f}s: "
            f"no worker could start within {timeout}"
        )
    return f"only {registered} of {config.np} workers registered within {timeout}"


def _no_hosts_note(book: Book, now: float) -> str:
    """What to add to a timeout's reason while discovery lists no host."""
    since = book.hosts.no_hosts_since
    if since is None:
        return ""
    return f"; discovery has listed no host for {now - since:.0f}s"


def next_wakeup(waits: Sequence[Wait], now: float) -> float:
    """Seconds the loop may sleep: until the earliest wait ends, within
    [``MIN_SLEEP``, ``MAX_SLEEP``]."""
    wake = min((w.until - now for w in waits), default=MAX_SLEEP)
    return min(MAX_SLEEP, max(MIN_SLEEP, wake))
