"""What a worker's exit means and the job's outcome (``driver.policy.exits``): pure
functions of records, plan, book and time, checked decision by decision."""

from __future__ import annotations

import dataclasses

import pytest

from driver import events as ev
from driver.policy import exits, lifecycle, occupancy, suspicion
from driver.policy.decisions import Book, CountFailure, Fail, Report, Succeed
from driver.policy.memory.failures import FailureBook
from driver.policy.memory.progress import ProgressBook
from driver.policy.memory.rounds import RoundBook
from driver.policy.planner import WorkerSlot
from rendezvous.schema.workers import FailureRecord
from tests.driver.policy.builders import S, hs, kinds, only, plan_of, rec, settings, table

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


# ----------------------------------------------------------------------------- outcome


def test_outcome_success_when_every_member_exited_0():
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(3, a, b)
    done = table(
        rec("a", 0, state=S.FINISHED, exit_code=0), rec("b", 1, state=S.FINISHED, exit_code=0)
    )
    assert exits.outcome(done, p, Book(RoundBook(0.0, resets=2))) == Succeed(
        round=3, size=2, resets=2
    )


def test_outcome_waits_while_members_run_or_all_failed():
    p = plan_of(1, rec("a", 0), rec("b", 1))
    running = table(rec("a", 0, state=S.FINISHED, exit_code=0), rec("b", 1))
    assert exits.outcome(running, p, Book.start(0.0)) is None
    failed = table(
        rec("a", 0, state=S.FAILED, exit_code=1), rec("b", 1, state=S.FAILED, exit_code=-9)
    )
    assert exits.outcome(failed, p, Book.start(0.0)) is None  # re-forming handles it


def test_outcome_fails_when_some_finished_and_others_failed():
    p = plan_of(4, rec("a", 0), rec("b", 1))
    mixed = table(
        rec("a", 0, state=S.FINISHED, exit_code=0), rec("b", 1, state=S.FAILED, exit_code=3)
    )
    decision = exits.outcome(mixed, p, Book.start(0.0))
    assert isinstance(decision, Fail)
    assert decision.reason == (
        "worker rank 1 (b) of the final round 4 exited with 3 after other workers had finished"
    )


def test_a_stopped_worker_did_not_finish_whatever_its_code():
    stopped = rec("b", 1, state=S.STOPPED, exit_code=0)
    assert exits.finish_code(stopped) == -1
    assert exits.finish_code(rec("b", state=S.STOPPED, exit_code=-15)) == -15
    assert exits.finish_code(rec("b", state=S.FINISHED, exit_code=0)) == 0
    assert exits.finish_code(rec("b")) is None
    p = plan_of(1, rec("a", 0), rec("b", 1))
    decision = exits.outcome(
        table(rec("a", 0, state=S.FINISHED, exit_code=0), stopped), p, Book.start(0.0)
    )
    assert isinstance(decision, Fail) and "exited with -1" in decision.reason


def test_outcome_before_any_round():
    assert exits.outcome({}, None, Book.start(0.0)) is None
    done = Book(RoundBook(0.0, done_slots=frozenset({WorkerSlot("h", 0)})))
    gone = table(dataclasses.replace(rec("a", 0, state=S.FINISHED, exit_code=0), registered_seq=3))
    assert exits.outcome(gone, None, done) == Fail("workers exited before the first round formed")
    never = table(rec("a", 0, state=S.FINISHED, exit_code=0))  # never registered
    decision = exits.outcome(never, None, done)
    assert isinstance(decision, Fail) and "call elastic.init()" in decision.reason
    assert exits.outcome(table(rec("b", 1)), None, done) is None  # one still runs


# ----------------------------------------------------------------------------- exits and the failure streak


def test_a_member_finishing_starts_the_finish_grace():
    a = rec("a", 0)
    p = plan_of(1, a)
    done, (decisions, book) = exits.worker_exited(a, 0, p, Book.start(0.0), now=7.0)
    assert done.state is S.FINISHED
    assert decisions == (Report(ev.WorkerExited(worker="a", host="h", slot=0, code=0, rank=0)),)
    assert book.rounds.done_slots == {("h", 0)} and book.rounds.member_finished_at == 7.0
    assert book.rounds.change_at == 7.0


def test_a_member_whose_training_returned_marks_the_training_done():
    a = rec("a", 0)
    p = plan_of(1, a, rec("b", 1))
    _, (_, book) = exits.worker_exited(a, 0, p, Book.start(0.0), now=7.0, trained_to_end=True)
    assert book.training_done
    # An exit 0 without the marker (a worker leaving early) starts only the finish grace,
    # and so does a non-member's, marker or not.
    _, (_, book) = exits.worker_exited(a, 0, p, Book.start(0.0), now=7.0)
    assert not book.training_done
    _, (_, book) = exits.worker_exited(
        rec("z", 3), 0, p, Book.start(0.0), now=7.0, trained_to_end=True
    )
    assert not book.training_done


def test_a_stopped_worker_is_no_failure():
    going = rec("a", 0, state=S.STOPPING)
    done, (decisions, book) = exits.worker_exited(going, -15, None, Book.start(0.0), now=3.0)
    assert done.state is S.STOPPED
    assert decisions == (Report(ev.WorkerStopped(worker="a", host="h", slot=0, code=-15)),)
    assert book == Book.start(0.0)


def test_a_failure_counts_against_host_and_streak_unless_chaos():
    a = rec("a", 1)
    p = plan_of(2, rec("z", 0), a)
    _, (decisions, book) = exits.worker_exited(a, 1, p, Book.start(0.0), now=3.0)
    assert decisions == (
        Report(
            ev.WorkerFailed(
                worker="a", host="h", slot=1, code=1, rank=1, in_round=True, chaos=False
            )
        ),
        CountFailure("h", 1),
    )
    assert book.rounds.change_at == 3.0
    victim = rec("a", 1, state=S.CHAOS_KILLED)
    _, (decisions, _) = exits.worker_exited(victim, -9, p, Book.start(0.0), now=3.0)
    assert only(decisions, Report).event == ev.WorkerFailed(
        worker="a", host="h", slot=1, code=-9, rank=1, in_round=True, chaos=True
    )


def test_failure_streak_limit():
    book = Book.start(0.0)
    for _ in range(exits.FAILURE_STREAK_MIN):
        decisions, book = exits.count_failure(book, available_slots=2, code=4)
        assert decisions == ()
    decisions, book = exits.count_failure(book, available_slots=2, code=4)
    assert book.failures.streak == 11
    assert decisions == (
        Fail(
            "11 workers failed in a row without a round forming (last exit: "
            "exit 4); see the worker output above"
        ),
    )
    # Three per slot when that is more: 15 with 5 slots.
    decisions, _ = exits.count_failure(
        Book(RoundBook(0.0), failures=FailureBook(streak=14)), available_slots=5, code=1
    )
    assert decisions == ()
    decisions, _ = exits.count_failure(
        Book(RoundBook(0.0), failures=FailureBook(streak=15)), available_slots=5, code=1
    )
    assert only(decisions, Fail).reason.startswith("16 workers failed")


# ----------------------------------------------------------------------------- launch failures


def failed_event(decisions) -> ev.WorkerFailed:
    """The ``WorkerFailed`` the first decision reports."""
    event = only(decisions[:1], Report).event
    assert isinstance(event, ev.WorkerFailed), event
    return event


def test_a_program_that_cannot_start_ends_the_job_before_anything_ran():
    decisions = exits.launch_failed(
        "h-0-1", "h", 0, "cannot start './nope': No such file or directory", None, False, True
    )
    assert decisions == [
        Report(
            ev.WorkerFailed(
                worker="h-0-1",
                host="h",
                slot=0,
                code=None,
                reason="launch failed: cannot start './nope': No such file or directory",
            )
        ),
        Fail("cannot start './nope': No such file or directory"),
    ]


@pytest.mark.parametrize("any_registered, permanent", [(True, True), (False, False)])
def test_other_launch_failures_count_against_host_and_streak(any_registered, permanent):
    reason = "cannot start 'python': Resource temporarily unavailable"
    decisions = exits.launch_failed("w", "h", 1, reason, None, any_registered, permanent)
    assert kinds(decisions) == [Report, CountFailure]
    assert decisions[1] == CountFailure("h", None, reason)
    counted, _ = exits.count_failure(
        Book(RoundBook(0.0), failures=FailureBook(streak=10)), 2, None, reason
    )
    assert only(counted, Fail).reason == (
        f"11 workers failed in a row without a round forming ({reason}); "
        "see the worker output above"
    )


@pytest.mark.parametrize("code, says", [(127, "command not found"), (126, "not executable")])
def test_a_shell_that_cannot_run_the_command_is_a_launch_failure(code, says):
    """Over ssh a missing program is the remote shell's 126/127, before any registration."""
    never = rec("a", 0, state=S.LAUNCHED)
    done, (decisions, _) = exits.worker_exited(
        never, code, None, Book.start(0.0), 2.0, command=("./nope", "x"), any_registered=False
    )
    assert done.state is S.FAILED
    reason = only(decisions[1:], Fail).reason
    assert reason.startswith(f"cannot start './nope' on h: exit {code} before it registered")
    assert says in reason and failed_event(decisions).reason == f"launch failed: {reason}"
    # Once some worker of the job ran, it counts instead (a host may lack the program).
    _, (decisions, _) = exits.worker_exited(
        never, code, None, Book.start(0.0), 2.0, command=("./nope",), any_registered=True
    )
    assert kinds(decisions) == [Report, CountFailure]
    # A worker that registered and then exits 127 is an ordinary failure.
    _, (decisions, _) = exits.worker_exited(
        rec("b", 1), code, None, Book.start(0.0), 2.0, command=("./nope",), any_registered=False
    )
    assert decisions[1] == CountFailure("h", code) and failed_event(decisions).reason is None


def test_a_worker_the_driver_killed_says_who_and_why():
    hung = lifecycle.killed(rec("a", 1), 3.0, reason="unresponsive (reported by its peers)")
    p = plan_of(2, rec("z", 0), rec("a", 1))
    done, (decisions, _) = exits.worker_exited(hung, -9, p, Book.start(0.0), now=4.0)
    event = failed_event(decisions)
    assert event.reason == "killed by the driver: unresponsive (reported by its peers)"
    assert str(event) == (
        "worker [1] h:1 failed (killed by SIGKILL): "
        "killed by the driver: unresponsive (reported by its peers)"
    )
    assert decisions[1] == CountFailure("h", -9) and not done.died_on_its_own


# ----------------------------------------------------------------------------- end failures


def test_every_member_failing_after_a_worker_finished_ends_the_job():
    """A worker finished in round 1; round 2 (the stragglers) all failed: nobody holds the
    state, so a replacement would start over after the work was done."""
    p = plan_of(2, rec("b", 1))
    t = table(rec("a", 0, state=S.FINISHED, exit_code=0), rec("b", 1, state=S.FAILED, exit_code=-6))
    done = Book(RoundBook(0.0, done_slots=frozenset({WorkerSlot("h", 0)})))
    assert exits.outcome(t, p, done) == Fail(
        "worker rank 0 (b) of the final round 2 exited with -6 after other workers had finished"
    )
    assert exits.outcome(t, p, Book.start(0.0)) is None  # no finish yet: replaced as usual


# ----------------------------------------------------------------------------- the finish


def test_after_the_finish_a_signal_fails_nothing():
    """A worker's training returned (its record): that commit is the job's result. A
    member SIGKILLed after it (the chaos racing the finish, a lost host) fails nothing,
    and the job ends once nobody runs."""
    p = plan_of(2, rec("a", 0), rec("b", 1))
    finished = Book(RoundBook(0.0, training_done_at=5.0), progress=ProgressBook(step=90))
    running = table(rec("a", 0, state=S.FINISHED, exit_code=0, since=6.0), rec("b", 1))
    assert exits.outcome(running, p, finished) is None
    killed = table(
        rec("a", 0, state=S.FINISHED, exit_code=0, since=6.0),
        rec("b", 1, state=S.FAILED, exit_code=-9, since=6.5),
    )
    assert exits.outcome(killed, p, finished) == Succeed(round=2, size=2, resets=0, step=90)


def test_after_the_finish_an_error_of_the_script_fails_the_job():
    p = plan_of(2, rec("a", 0), rec("b", 1))
    finished = Book(RoundBook(0.0, training_done_at=5.0))
    one = table(
        rec("a", 0, state=S.FINISHED, exit_code=0, since=6.0),
        rec("b", 1, state=S.FAILED, exit_code=1, since=6.0),
    )
    reason = only([exits.outcome(one, p, finished)], Fail).reason
    assert reason.startswith("worker rank 1 (b) ended (exit 1) after the training finished")
    every = table(
        rec("a", 0, state=S.FAILED, exit_code=1, since=6.0),
        rec("b", 1, state=S.FAILED, exit_code=1, since=6.0),
    )
    reason = only([exits.outcome(every, p, finished)], Fail).reason
    assert reason.startswith("the training script fails: every worker of round 2")
    # An error before the finish was replaced as usual: not the script's end.
    early = table(
        rec("a", 0, state=S.FINISHED, exit_code=0, since=6.0),
        rec("b", 1, state=S.FINISHED, exit_code=0, since=6.0),
        rec("z", 2, state=S.FAILED, exit_code=1, since=1.0),
    )
    assert isinstance(exits.outcome(early, p, finished), Succeed)


def test_after_the_finish_with_nobody_exiting_0_the_job_fails():
    p = plan_of(2, rec("a", 0), rec("b", 1))
    t = table(
        rec("a", 0, state=S.FAILED, exit_code=-9, since=6.0),
        rec("b", 1, state=S.FAILED, exit_code=-9, since=6.0),
    )
    reason = only([exits.outcome(t, p, Book(RoundBook(0.0, training_done_at=5.0)))], Fail).reason
    assert "every worker was killed before it exited" in reason


def test_after_the_finish_no_report_accuses_and_no_worker_is_relaunched():
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(2, a, b)
    finished = Book(RoundBook(0.0, training_done_at=5.0))
    report = FailureRecord("a", 2, "connection closed", suspect="b")
    _, book = suspicion.failure_reported(table(a, b), p, finished, report, now=6.0)
    assert book.failures.accused == ()
    cfg = settings("-np", "2")
    assert occupancy.slots_to_fill(table(a), hs("h:2"), finished, cfg.max_np) == []


def test_members_leaving_at_their_commit_that_exit_0_after_the_finish_finished():
    """A world replaced whole (discovery lists only a blacklisted host): its members
    leave at their next commit (nothing is sent to them) and train on meanwhile, to the
    end. Their exits 0 after the finish are the script's end: the job succeeds. A
    worker the driver stopped (SIGTERM) did not finish, whatever its code."""
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(5, a, b)
    leaving = Book.start(0.0).leaves("a", 30.0).leaves("b", 30.0)
    done = dataclasses.replace(
        leaving, rounds=dataclasses.replace(leaving.rounds, training_done_at=5.0)
    )
    t = table(lifecycle.stopping(a, 1.0), lifecycle.stopping(b, 1.0))
    a_done, _ = exits.worker_exited(t["a"], 0, p, done, 6.0, trained_to_end=True)
    b_done, _ = exits.worker_exited(t["b"], 0, p, done, 6.1)
    assert (a_done.state, b_done.state) == (S.FINISHED, S.FINISHED)
    assert isinstance(exits.outcome(table(a_done, b_done), p, done), Succeed)
    # Before the finish, a leaving worker's exit 0 is its handover: stopped, no finish.
    left, _ = exits.worker_exited(t["a"], 0, p, leaving, 6.0)
    assert left.state is S.STOPPED
    # Stopped by the driver (not leaving): no finish, whatever its code.
    finished = Book(RoundBook(0.0, training_done_at=5.0))
    stopped, _ = exits.worker_exited(t["a"], 0, p, finished, 6.0)
    assert stopped.state is S.STOPPED
