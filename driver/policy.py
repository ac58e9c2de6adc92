"""The job's rules, as pure functions that return decisions.

Each function looks at the worker records (``driver.workers``), the current plan, the
job's ``Book`` (what the loop remembers between decisions), a ``HostsView`` (the host
manager's answers), the config and ``now``, and returns what to do (``driver.decisions``):
``Publish``, ``Wait``, ``Fail``, ``Kill``, ``Stop``, ``Launch``, ``Report`` (an event to
emit), ``CountFailure``, ``Succeed``, or nothing. None of them touches the store, a
process or a clock; the main loop (``driver.job``) carries the decisions out. Functions
that also update the book return a ``Step`` (the decisions and the new book).

The rules:

* Outcome (``outcome``): the job succeeds when every member of the current round has
  finished and all exited 0; it fails when some finished and others failed (the finished
  ones cannot be replaced: their state is gone), or when workers finished before any
  round formed. A worker the driver stopped did not finish, whatever its code.
* The script fails everywhere (``plan_round``): every member of two rounds in a row
  exited with an error code of its own (no signal, no stop) ends the job; one such
  round is replaced as usual (with -np 1 it is just a failed worker).
* Exits (``worker_exited``): a worker the driver stopped is stopped, whatever its code;
  else 0 is finished and anything else failed, counted against its host and the streak
  unless the chaos killed it.
* Failure streak (``count_failure``): more than ``max(FAILURE_STREAK_MIN, 3 x slots)``
  worker failures with no round forming end the job: they die before they can join.
* Launch failures (``launch_failed``, and a shell's 126/127 from a worker that never
  registered, in ``worker_exited``): before any worker of the job registered, a program
  that cannot start ends the job at once with what failed; later it counts like a
  failed worker.
* After a finish (``outcome``): when a worker has finished and every member of the
  current round then failed, the job fails: nobody holds the state to hand on.
* Lost rounds (``rounds_lost``): ``LOST_ROUNDS_LIMIT`` rounds in a row whose members
  all died on their own, by any code or signal, end the job.
* No hosts (``no_hosts``): while discovery lists no host, say so at once and every
  ``REPEAT_REPORT_EVERY`` seconds; the timeouts' reasons name it.
* The store (``store_health``, applied by the probe's own thread: the loop may be
  the one waiting for the store): a store that stops answering is said at once and
  every ``REPEAT_REPORT_EVERY`` seconds, and its return.
* Progress (``progress_report``): every ``--progress-interval``, the round, its size,
  rank 0's committed step and the steps per second.
* First round (``plan_round``): wait for ``-np`` registered workers, up to
  ``--start-timeout``; once there are, wait ``FIRST_ROUND_GRACE`` for the rest of those
  launched, so a job on 8 slots forms one round of 8.
* Finish grace: after a member exits 0, no round for ``FINISH_GRACE`` (the others are
  most likely finishing too).
* Join batch window: a bigger round waits while workers launched less than
  ``JOIN_BATCH_WINDOW`` ago have not registered, if the current round still works.
* Reregister grace (``workers_to_kill``): a worker whose registration lapsed and that
  has not registered again within ``REREGISTER_GRACE`` is killed (it is hung).
* Broken round (``plan_round``): a round that lost members and cannot re-form is
  reported after ``WAITING_REPORT_AFTER`` and ends the job after ``--elastic-timeout``.
* Reset limit: publishing a round beyond ``--reset-limit`` re-forms ends the job
  (rounds after a worker finished are not resets).
* All hosts blacklisted (``hosts_rule``): with nothing running, wait for the first
  cooldown to end, unless that is later than the job may wait anyway.
* Wake-up (``next_wakeup``): the earliest ``Wait``, at most ``MAX_SLEEP`` away.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from driver import planner, workers
from driver.config import JobConfig
from driver.decisions import (
    Book,
    CountFailure,
    Decision,
    Fail,
    HostsView,
    Kill,
    Launch,
    Publish,
    Report,
    Step,
    Stop,
    StoreHealth,
    Succeed,
    Wait,
)
from driver.events import (
    ChaosKill,
    Event,
    Progress,
    StoreBack,
    StoreUnreachable,
    Waiting,
    WorkerExited,
    WorkerFailed,
    WorkerStopped,
    WorkerStopping,
    describe_code,
)
from driver.hosts import HostSlots
from driver.workers import WorkerRecord, WorkerState
from rendezvous.plan import Plan, WorkerInfo

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
#: a worker whose registration vanished (lease expired) but whose process runs is killed
#: if it has not registered again after this long: it is hung, and its slot is refilled
REREGISTER_GRACE = 10.0
#: worker failures in a row, with no round forming, that end the job (at least this many,
#: or three per slot): the workers die before they can join, restarting will not help
FAILURE_STREAK_MIN = 10
#: rounds in a row whose members all died on their own (any code or signal, none stopped
#: or killed by the driver or the chaos) that end the job: each time the job started
#: over from nothing, and it would again (a worker that always crashes at its end)
LOST_ROUNDS_LIMIT = 3
#: how often a wait that may be a mistake is said again (discovery lists no host)
REPEAT_REPORT_EVERY = 5.0
#: exit codes a shell gives a command it cannot run: 126 found but not executable, 127
#: not found (how a missing program shows over ssh, where no local exec can fail)
CANNOT_RUN_CODES = {126: "not executable", 127: "command not found"}
#: progress intervals without a new step from rank 0 after which training has stalled
STALLED_AFTER = 2.5
#: the loop looks at the job at least this often, whatever it waits for
MAX_SLEEP = 1.0
MIN_SLEEP = 0.01

Workers = Mapping[str, WorkerRecord]


# ----------------------------------------------------------------------------- workers


def live_infos(workers: Workers) -> list[WorkerInfo]:
    """Registrations of the live workers, in registration order (what the planner takes)."""
    live = sorted(
        (r for r in workers.values() if r.live and r.info is not None),
        key=lambda r: r.registered_seq,
    )
    return [r.info for r in live if r.info is not None]


def workers_to_stop(workers: Workers, usable: Sequence[HostSlots]) -> list[Decision]:
    """Stop the active workers whose host or slot left the job (and say so)."""
    active = [r for r in workers.values() if r.state.active]
    reason = "its host or slot left the job"
    decisions: list[Decision] = []
    for r in planner.displaced_workers(active, usable):
        event = WorkerStopping(worker=r.worker_id, host=r.host, slot=r.slot, reason=reason)
        decisions += [Report(event), Stop(r.worker_id, reason)]
    return decisions


def workers_to_kill(workers: Workers, now: float) -> list[Kill]:
    """Workers whose registration lapsed more than ``REREGISTER_GRACE`` ago."""
    return [
        Kill(
            r.worker_id,
            f"its registration lapsed and it did not register again within {REREGISTER_GRACE:g}s",
        )
        for r in workers.values()
        if r.state is WorkerState.UNREGISTERED and now - r.since > REREGISTER_GRACE
    ]


def lapse_waits(workers: Workers) -> list[Wait]:
    """When each lapsed registration's grace ends."""
    return [
        Wait(r.since + REREGISTER_GRACE, f"{r.worker_id} to register again")
        for r in workers.values()
        if r.state is WorkerState.UNREGISTERED
    ]


def slots_to_fill(
    workers: Workers, usable: Sequence[HostSlots], book: Book, config: JobConfig
) -> list[Launch]:
    """A launch for each free slot (running workers and finished slots occupy theirs)."""
    occupied = [(r.host, r.slot) for r in workers.values() if r.state.running]
    return [
        Launch(host, slot)
        for host, slot in planner.slots_to_fill(
            usable, occupied + sorted(book.done_slots), config.max_np
        )
    ]


def chaos_kill(rec: WorkerRecord, plan: Plan | None, pid: int, kills: int) -> list[Decision]:
    """The chaos chose ``rec`` (process ``pid``, its ``kills``-th victim): say so, kill it."""
    member = plan.member(rec.worker_id) if plan is not None else None
    event = ChaosKill(
        worker=rec.worker_id,
        host=rec.host,
        slot=rec.slot,
        rank=member.rank if member is not None else None,
        pid=pid,
        kill=kills,
    )
    return [Report(event), Kill(rec.worker_id, "chaos", chaos=True)]


def chaos_candidates(workers: Workers, plan: Plan | None, book: Book) -> list[str]:
    """Members of the round the chaos may kill (none once a worker finished: the end of
    training is not the time to test recovery)."""
    if plan is None or book.done_slots:
        return []
    return [m.worker_id for m in plan.members if workers[m.worker_id].state.active]


def worker_exited(
    rec: WorkerRecord,
    code: int,
    plan: Plan | None,
    book: Book,
    now: float,
    *,
    command: Sequence[str] = (),
    any_registered: bool = True,
) -> tuple[WorkerRecord, Step]:
    """The worker's process exited with ``code``: its new record, the event to report,
    and whether the failure counts (a chaos victim's does not: its host did nothing
    wrong). A member that finished starts the finish grace. A worker the driver killed
    says so, and why. A shell's "cannot run" code (``CANNOT_RUN_CODES``) from a worker
    that never registered is a launch failure of ``command`` (``launch_failed``; it ends
    the job unless ``any_registered``, a worker of the job ever registered)."""
    done = workers.exited(rec, code, now)
    member = plan.member(rec.worker_id) if plan is not None else None
    rank = member.rank if member is not None else None
    wid, host, slot = rec.worker_id, rec.host, rec.slot
    decisions: list[Decision]
    if done.state is WorkerState.FINISHED:
        decisions = [Report(WorkerExited(worker=wid, host=host, slot=slot, code=code, rank=rank))]
        book = book.finished(host, slot, member is not None, now)
    elif done.state is WorkerState.STOPPED:
        decisions = [Report(WorkerStopped(worker=wid, host=host, slot=slot, code=code))]
    elif code in CANNOT_RUN_CODES and not rec.ever_registered and rec.kill_reason is None:
        program = command[0] if command else "the command"
        reason = (
            f"cannot start {program!r} on {host}: exit {code} before it registered "
            f"(the shell's '{CANNOT_RUN_CODES[code]}'; see the worker output above)"
        )
        decisions = launch_failed(wid, host, slot, reason, code, any_registered, permanent=True)
    else:
        chaos = rec.state is WorkerState.CHAOS_KILLED
        killed = rec.state is WorkerState.KILLED
        decisions = [
            Report(
                WorkerFailed(
                    worker=wid,
                    host=host,
                    slot=slot,
                    code=code,
                    rank=rank,
                    in_round=member is not None,
                    chaos=chaos,
                    reason=f"killed by the driver: {rec.kill_reason}" if killed else None,
                )
            )
        ]
        if not chaos:
            decisions.append(CountFailure(rec.host, code))
    if member is not None:
        book = book.changed(now)
    return done, Step(tuple(decisions), book)


def launch_failed(
    worker_id: str,
    host: str,
    slot: int,
    reason: str,
    code: int | None,
    any_registered: bool,
    permanent: bool,
) -> list[Decision]:
    """A worker could not be started (``reason``: the launcher's error, or a shell's
    "cannot run" exit ``code``). Before any worker of the job registered, a ``permanent``
    failure (the program is missing or not executable, a missing working directory)
    ends the job at once with that reason: every try would fail alike. Otherwise it
    counts against the host and the streak, like a failed worker."""
    event = WorkerFailed(
        worker=worker_id, host=host, slot=slot, code=code, reason=f"launch failed: {reason}"
    )
    if permanent and not any_registered:
        return [Report(event), Fail(reason)]
    return [Report(event), CountFailure(host, code, reason)]


def count_failure(
    book: Book, available_slots: int, code: int | None, reason: str | None = None
) -> Step:
    """A worker failed on its own (not the chaos; ``reason``: why it could not start).
    Fails the job past the streak limit."""
    streak = book.failure_streak + 1
    book = replace(book, failure_streak=streak)
    if streak > max(FAILURE_STREAK_MIN, 3 * available_slots):
        last = reason if reason is not None else f"last exit: {describe_code(code)}"
        return Step(
            (
                Fail(
                    f"{streak} workers failed in a row without a round forming "
                    f"({last}); see the worker output above"
                ),
            ),
            book,
        )
    return Step((), book)


# ----------------------------------------------------------------------------- hosts


def hosts_rule(
    workers: Workers, plan: Plan | None, book: Book, hosts: HostsView, config: JobConfig, now: float
) -> list[Decision]:
    """A wait for the next cooldown to end; and when every host is blacklisted and no
    worker runs, a failure if that end is later than the job may wait."""
    release = hosts.next_release
    if hosts.all_blacklisted and not any(r.state.running for r in workers.values()):
        if plan is None:
            limit, flag = book.started_at + config.start_timeout, "--start-timeout"
        else:
            since = book.broken_since if book.broken_since is not None else now
            limit = since + config.elastic_timeout
            flag = "--elastic-timeout"
        if release is None or release > limit:
            return [
                Fail(
                    "every host is blacklisted after repeated worker failures ("
                    + ", ".join(hosts.blacklisted)
                    + f") and none comes back within {flag}"
                )
            ]
    return [Wait(release, "a blacklisted host to come back")] if release is not None else []


def no_hosts(book: Book, hosts: HostsView, config: JobConfig, now: float) -> Step:
    """Discovery lists no host at all: say so at once and every ``REPEAT_REPORT_EVERY``
    seconds while it lasts (an empty list is more often a broken script than a wait for
    machines, and either way the user should know what the job waits for)."""
    if not hosts.none_listed:
        if book.no_hosts_since is None:
            return Step((), book)
        return Step((), replace(book, no_hosts_since=None, no_hosts_said_at=None))
    since = book.no_hosts_since if book.no_hosts_since is not None else now
    said = book.no_hosts_said_at
    decisions: list[Decision] = []
    if said is None or now - said >= REPEAT_REPORT_EVERY:
        source = "the discovery script" if config.uses_discovery else "the host list"
        what = f"a host: {source} lists none"
        decisions.append(Report(Waiting(what=what, waited=round(now - since, 3))))
        said = now
    decisions.append(Wait(said + REPEAT_REPORT_EVERY, "the next word on the empty host list"))
    return Step(tuple(decisions), replace(book, no_hosts_since=since, no_hosts_said_at=said))


def _start_timeout_reason(registered: int, book: Book, config: JobConfig, now: float) -> str:
    timeout = f"--start-timeout {config.start_timeout:g}s"
    if book.no_hosts_since is not None and registered == 0:
        return (
            f"discovery has listed no host for {now - book.no_hosts_since:.0f}s: "
            f"no worker could start within {timeout}"
        )
    return f"only {registered} of {config.np} workers registered within {timeout}"


def _no_hosts_note(book: Book, now: float) -> str:
    """What to add to a timeout's reason while discovery lists no host."""
    if book.no_hosts_since is None:
        return ""
    return f"; discovery has listed no host for {now - book.no_hosts_since:.0f}s"


# ----------------------------------------------------------------------------- the store


def store_health(
    health: StoreHealth, answered: bool, error: str, now: float
) -> tuple[StoreHealth, list[Event]]:
    """One look at the store (``answered``, else ``error``) and what to say of it: a
    store that stops answering at once, again every ``REPEAT_REPORT_EVERY`` seconds
    while it does not, and its return with how long it was away."""
    if answered:
        if health.down_since is None:
            return health, []
        return StoreHealth(), [StoreBack(seconds=round(now - health.down_since, 3))]
    if health.down_since is None:
        return StoreHealth(now, now, error), [StoreUnreachable(seconds=0.0, error=error)]
    if health.said_at is not None and now - health.said_at < REPEAT_REPORT_EVERY:
        return replace(health, error=error), []
    since = round(now - health.down_since, 3)
    return StoreHealth(health.down_since, now, error), [StoreUnreachable(since, error)]


# ----------------------------------------------------------------------------- progress


def progress_report(book: Book, plan: Plan | None, config: JobConfig, now: float) -> Step:
    """Every ``--progress-interval`` once rank 0 has published a step: the round, its
    size, the step, and the steps per second between rank 0's last two publications;
    0.0 once none came for ``STALLED_AFTER`` intervals (rank 0 publishes only a step
    that moved: training stalls)."""
    interval, step, said_at = config.progress_interval, book.progress_step, book.progress_said_at
    if not interval or plan is None or step is None or book.progress_at is None:
        return Step((), book)
    if said_at is not None and now - said_at < interval:
        return Step((Wait(said_at + interval, "the next progress line"),), book)
    rate = book.progress_rate
    if now - book.progress_at > STALLED_AFTER * interval:
        rate = 0.0
    event = Progress(round=plan.round_id, size=plan.size, step=step, steps_per_second=rate)
    book = replace(book, progress_said_at=now)
    return Step((Report(event), Wait(now + interval, "the next progress line")), book)


# ----------------------------------------------------------------------------- rounds


def plan_round(
    workers: Workers, plan: Plan | None, book: Book, hosts: HostsView, config: JobConfig, now: float
) -> Step:
    """Whether to publish a round now, wait, or give up (see the module docstring)."""
    if book.member_finished_at is not None and now - book.member_finished_at < FINISH_GRACE:
        return Step((Wait(book.member_finished_at + FINISH_GRACE, "the others to finish"),), book)
    live = live_infos(workers)
    if plan is None:
        if len(live) < config.np:
            book = replace(book, np_registered_at=None)
            if now - book.started_at > config.start_timeout:
                return Step(
                    (Fail(_start_timeout_reason(len(live), book, config, now)),),
                    book,
                )
            return Step((Wait(book.started_at + config.start_timeout, "-np workers"),), book)
        registered_at = book.np_registered_at if book.np_registered_at is not None else now
        book = replace(book, np_registered_at=registered_at)
        launched = sum(1 for r in workers.values() if r.state.active)
        grace_end = registered_at + FIRST_ROUND_GRACE
        if len(live) < launched and now < grace_end:
            return Step((Wait(grace_end, "the rest of the first workers"),), book)
        min_np = config.np
    else:
        min_np = config.min_np
    candidate = planner.next_plan(plan, live, hosts.usable, min_np, config.max_np)
    intact = plan is not None and planner.round_is_intact(plan, live, hosts.usable)
    decisions: list[Decision] = []
    if candidate is not None and planner.needs_new_round(plan, candidate):
        joiners = [
            r.launched_at
            for r in workers.values()
            if r.state in (WorkerState.LAUNCHED, WorkerState.UNREGISTERED)
        ]
        if not planner.hold_growth_for_joiners(
            intact, [now - t for t in joiners], JOIN_BATCH_WINDOW
        ):
            return _publish(candidate, plan, book, config, now)
        decisions.append(Wait(max(joiners) + JOIN_BATCH_WINDOW, "new workers to register"))
    if plan is None:
        return Step(tuple(decisions), book)
    if intact:
        return Step(tuple(decisions), replace(book, broken_since=None))  # a lapse is over
    return _broken(workers, plan, book, len(live), min_np, hosts, config, now)


def _publish(candidate: Plan, plan: Plan | None, book: Book, config: JobConfig, now: float) -> Step:
    resets = book.resets
    if plan is not None and not book.done_slots:
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
    took = now - (book.change_at if book.change_at is not None else now)
    book = replace(book, resets=resets, broken_since=None, change_at=None, failure_streak=0)
    return Step((Publish(candidate, round(took, 3)),), book)


def _broken(
    workers: Workers,
    plan: Plan,
    book: Book,
    have: int,
    min_np: int,
    hosts: HostsView,
    config: JobConfig,
    now: float,
) -> Step:
    """The round lost members and no plan of ``min_np`` can form yet."""
    book, failed = script_fails(workers, plan, book)
    if failed is None:
        book, failed = rounds_lost(workers, plan, book)
    if failed is not None:
        return Step((failed,), book)
    decisions: list[Decision] = []
    if book.broken_since is None:
        book = replace(book, broken_since=now, waiting_reported=False)
    since = book.broken_since if book.broken_since is not None else now
    if not book.waiting_reported:
        if now - since > WAITING_REPORT_AFTER:
            book = replace(book, waiting_reported=True)
            decisions.append(
                Report(
                    Waiting(
                        what=f"round {plan.round_id} lost workers; waiting for {min_np} to re-form "
                        f"(have {have})",
                        waited=round(now - since, 3),
                    )
                )
            )
        else:
            decisions.append(Wait(since + WAITING_REPORT_AFTER, "a round to re-form"))
    if now - since > config.elastic_timeout:
        blacklisted = hosts.blacklisted
        decisions.append(
            Fail(
                f"no round of at least {min_np} workers could form within "
                f"--elastic-timeout {config.elastic_timeout:g}s (have {have}"
                + (f"; blacklisted: {', '.join(blacklisted)}" if blacklisted else "")
                + _no_hosts_note(book, now)
                + ")"
            )
        )
    else:
        decisions.append(Wait(since + config.elastic_timeout, "--elastic-timeout"))
    return Step(tuple(decisions), book)


def script_fails(workers: Workers, plan: Plan, book: Book) -> tuple[Book, Fail | None]:
    """Every member of two rounds in a row exited with an error code of its own (no
    signal, no stop): the script fails deterministically, and replacing the workers
    again would only repeat it. The book remembers rounds whose members all failed."""
    members = [workers[m.worker_id] for m in plan.members]
    if not members or not all(
        r.state is WorkerState.FAILED and r.exit_code is not None and r.exit_code > 0
        for r in members
    ):
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


def rounds_lost(workers: Workers, plan: Plan, book: Book) -> tuple[Book, Fail | None]:
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


# ----------------------------------------------------------------------------- the end


def finish_code(rec: WorkerRecord) -> int | None:
    """A worker's exit code as the outcome sees it: one the driver stopped did not
    finish, whatever its code (a SIGTERM handler may well exit 0)."""
    if rec.state is WorkerState.STOPPED:
        return rec.exit_code or -1
    return rec.exit_code if not rec.state.running else None


def outcome(workers: Workers, plan: Plan | None, book: Book) -> Succeed | Fail | None:
    """``Succeed`` when every member of the round exited 0; ``Fail`` when the round
    ended with some members finished and others failed, or with every member failed
    after a worker of an earlier round finished, or workers finished before a first
    round; None while the job runs (or a round of failures that re-forming handles)."""
    if plan is None:
        if book.done_slots and not any(r.state.running for r in workers.values()):
            return Fail("workers exited before the first round formed")
        return None
    codes = {m.worker_id: finish_code(workers[m.worker_id]) for m in plan.members}
    if any(code is None for code in codes.values()):
        return None
    if 0 not in codes.values() and not book.done_slots:
        return None  # a round of failures: re-forming (or replacing) handles it
    # Some member finished, of this round or (``done_slots``) of an earlier one, and every
    # other failed: nobody alive holds the training state to hand on, and a replacement
    # would start over from nothing after the work was done.
    failed = [m for m in plan.members if codes[m.worker_id] != 0]
    if failed:
        m = failed[0]
        return Fail(
            f"worker rank {m.rank} ({m.worker_id}) of the final round "
            f"{plan.round_id} exited with {codes[m.worker_id]} "
            "after other workers had finished"
        )
    return Succeed(round=plan.round_id, size=plan.size, resets=book.resets)


def next_wakeup(waits: Sequence[Wait], now: float) -> float:
    """Seconds the loop may sleep: until the earliest wait ends, within
    [``MIN_SLEEP``, ``MAX_SLEEP``]."""
    wake = min((w.until - now for w in waits), default=MAX_SLEEP)
    return min(MAX_SLEEP, max(MIN_SLEEP, wake))
