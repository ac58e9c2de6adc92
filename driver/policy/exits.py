"""What a worker's exit means for the job, and the job's outcome (pure).

A worker's process exits (``worker_exited``) or cannot be started (``launch_failed``);
a failure of its own counts toward a streak (``count_failure``); after each message
``outcome`` says whether the job is over. Apart from the round rules
(``driver.policy.rounds``): these look at one worker and at the end of the job, not at
what the next round should be.

The rules:

* Exits (``worker_exited``): a worker the driver stopped is stopped, whatever its code;
  else 0 is finished and anything else failed, counted against its host and the streak
  unless the chaos killed it. A worker leaving at its next commit (nothing sent to it)
  that exits 0 once the training finished finished too. A spare's exit is quiet
  (``driver.policy.spares``).
* Launch failures (``launch_failed``, and a shell's 126/127 from a worker that never
  registered, in ``worker_exited``): before any worker of the job registered, a program
  that cannot start ends the job at once with what failed; later it counts like a
  failed worker.
* Failure streak (``count_failure``): more than ``max(FAILURE_STREAK_MIN, 3 x slots)``
  worker failures with no round forming end the job: they die before they can join.
* Outcome (``outcome``): the job succeeds when every member of the current round has
  finished and all exited 0; it fails when some finished and others failed (the finished
  ones cannot be replaced: their state is gone), or when workers finished before any
  round formed. A worker the driver stopped did not finish, whatever its code.
* After a finish (``finished_outcome``): once a worker recorded that its training
  returned, that commit is the job's result. The job ends when no worker runs; what a
  signal or a kill ends after the finish fails nothing, an error code of a worker's own
  does (the script's end fails), and so does a finish after which no worker exited 0.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import replace

from driver.events import WorkerExited, WorkerFailed, WorkerStopped, describe_code
from driver.policy import lifecycle
from driver.policy.decisions import Book, CountFailure, Decision, Fail, Report, Step, Succeed
from driver.policy.lifecycle import WorkerRecord, Workers, WorkerState
from driver.policy.spares import spare_exited
from rendezvous.schema.rounds import Plan

#: worker failures in a row, with no round forming, that end the job (at least this many,
#: or three per slot): the workers die before they can join, restarting will not help
FAILURE_STREAK_MIN = 10
#: exit codes a shell gives a command it cannot run: 126 found but not executable, 127
#: not found (how a missing program shows over ssh, where no local exec can fail)
CANNOT_RUN_CODES = {126: "not executable", 127: "command not found"}


def worker_exited(
    rec: WorkerRecord,
    code: int,
    plan: Plan | None,
    book: Book,
    now: float,
    *,
    command: Sequence[str] = (),
    any_registered: bool = True,
    trained_to_end: bool = False,
) -> tuple[WorkerRecord, Step]:
    """The worker's process exited with ``code``: its new record, the event to report,
    and whether the failure counts (a chaos victim's does not: its host did nothing
    wrong). A member that finished starts the finish grace. A worker the driver killed
    says so, and why. A shell's "cannot run" code (``CANNOT_RUN_CODES``) from a worker
    that never registered is a launch failure of ``command`` (``launch_failed``; it ends
    the job unless ``any_registered``, a worker of the job ever registered). A member that
    finished with ``trained_to_end`` (its ``@elastic.run`` function returned) marks the
    training done. A spare's exit is quiet (``spares.spare_exited``)."""
    if rec.spare:
        return spare_exited(rec, code, book, now)
    done = lifecycle.exited(rec, code, now)
    if _finished_while_leaving(rec, code, book, trained_to_end):
        done = replace(done, state=WorkerState.FINISHED)  # (not STOPPED: no signal sent)
    member = plan.member(rec.worker_id) if plan is not None else None
    rank = member.rank if member is not None else None
    wid, host, slot = rec.worker_id, rec.host, rec.slot
    decisions: list[Decision]
    if done.state is WorkerState.FINISHED:
        decisions = [Report(WorkerExited(worker=wid, host=host, slot=slot, code=code, rank=rank))]
        rounds = book.rounds.finished(host, slot, member is not None, now)
        if trained_to_end and member is not None:
            rounds = rounds.training_finished(now)
        book = replace(book, rounds=rounds)
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
                    after_finish=book.training_done,
                )
            )
        ]
        if not chaos and not book.training_done:  # (nothing is relaunched after the end)
            decisions.append(CountFailure(rec.host, code))
    if member is not None:
        book = book.changed(now)
    return done, Step(tuple(decisions), book)


def _finished_while_leaving(rec: WorkerRecord, code: int, book: Book, trained_to_end: bool) -> bool:
    """A worker leaving at its next commit (``Leave``: its host was dropped or is
    drained; nothing was sent to it) that exits 0 once the training finished (or is
    the finisher) finished: it ran the script's end like any member. Counted as
    stopped, a job whose every member was leaving at the finish (a world replaced
    whole while its newcomers could not start) would fail although it succeeded."""
    leaving = rec.state is WorkerState.STOPPING and rec.worker_id in book.hosts.leaving_ids()
    return leaving and code == 0 and (book.training_done or trained_to_end)


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
    streak = book.failures.streak + 1
    book = replace(book, failures=replace(book.failures, streak=streak))
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


def finish_code(rec: WorkerRecord) -> int | None:
    """A worker's exit code as the outcome sees it: one the driver stopped did not
    finish, whatever its code (a SIGTERM handler may well exit 0)."""
    if rec.state is WorkerState.STOPPED:
        return rec.exit_code or -1
    return rec.exit_code if not rec.state.running else None


def outcome(workers: Workers, plan: Plan | None, book: Book) -> Succeed | Fail | None:
    """Once the training finished (``book.training_done``): ``finished_outcome``.
    Before: ``Succeed`` when every member of the round exited 0; ``Fail`` when the round
    ended with some members finished and others failed, or with every member failed
    after a worker of an earlier round finished, or workers finished before a first
    round; None while the job runs (or a round of failures that re-forming handles)."""
    if book.training_done:
        return finished_outcome(workers, plan, book)
    if plan is None:
        if book.rounds.done_slots and not any(r.state.running for r in workers.values()):
            if any(r.ever_registered for r in workers.values()):
                return Fail("workers exited before the first round formed")
            # The usual cause: a script that never joins (no elastic.init(), no
            # @elastic.run), which runs to its end alone and exits 0.
            return Fail(
                "workers exited before the first round formed, none having joined the "
                "job: does the script call elastic.init() (or use @elastic.run)?"
            )
        return None
    codes = {m.worker_id: finish_code(workers[m.worker_id]) for m in plan.members}
    if any(code is None for code in codes.values()):
        return None
    if 0 not in codes.values() and not book.rounds.done_slots:
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
    return Succeed(plan.round_id, plan.size, book.rounds.resets, book.progress.step)


#: signals a process raises on itself when it crashes (an abort, a bad access, a bad
#: instruction): after the finish, the script's end failing, unlike a kill from outside
#: (SIGKILL: the chaos, the OOM killer; SIGTERM, SIGINT, SIGHUP: a scheduler, a person)
CRASH_SIGNALS = frozenset(
    {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGSYS}
)


def _the_scripts_error(code: int | None) -> bool:
    """An exit with an error code of the script's own, or a crash of its own."""
    if code is None:
        return False
    return code > 0 or -code in CRASH_SIGNALS


def finished_outcome(workers: Workers, plan: Plan | None, book: Book) -> Succeed | Fail | None:
    """The job's end once a worker recorded that its training function returned having
    committed the final step: that commit is the job's result. The job ends when no
    worker (spares aside) runs any more. What ended after the finish by a kill from
    outside (the chaos, a lost host, the driver, a SIGKILL or SIGTERM) fails nothing:
    the others were told the training is done, or finished themselves. It fails when a
    worker exited with an error code of its own, or crashed (``CRASH_SIGNALS``), after
    the finish (the script's end fails: said as the script failing when every member of
    the round did), or when no worker exited 0 after it (the script's end ran
    nowhere)."""
    if any(r.state.running and not r.spare for r in workers.values()):
        return None
    done_at = book.rounds.training_done_at if book.rounds.training_done_at is not None else 0.0
    ended = [
        r
        for r in workers.values()
        if not r.spare and r.exit_code is not None and r.since >= done_at
    ]
    errors = [r for r in ended if r.died_on_its_own and _the_scripts_error(r.exit_code)]
    members = [workers[m.worker_id] for m in plan.members] if plan is not None else []
    round_id = plan.round_id if plan is not None else 0
    if errors:
        codes = sorted({r.exit_code for r in errors if r.exit_code is not None})
        if members and all(r in errors for r in members):
            return Fail(
                f"the training script fails: every worker of round {round_id} exited with "
                f"an error after its training finished (codes {codes}); see the worker "
                "output above"
            )
        r = errors[0]
        member = plan.member(r.worker_id) if plan is not None else None
        rank = f"rank {member.rank} " if member is not None else ""
        return Fail(
            f"worker {rank}({r.worker_id}) ended ({describe_code(r.exit_code)}) after the "
            "training finished: the script's end fails; see the worker output above"
        )
    if not any(r.state is WorkerState.FINISHED for r in [*ended, *members]):
        signals = sorted({describe_code(r.exit_code) for r in ended})
        return Fail(
            "the training finished, but every worker was killed before it exited ("
            + ", ".join(signals)
            + "): the script's end after its training ran nowhere"
        )
    size = plan.size if plan is not None else 0
    return Succeed(round_id, size, book.rounds.resets, book.progress.step)
