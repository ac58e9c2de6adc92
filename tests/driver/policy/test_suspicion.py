"""Who is dead (``driver.policy.suspicion``): failure reports and silent peers turned
into host probes and kills, checked decision by decision."""

from __future__ import annotations

import dataclasses

import pytest

from driver import events as ev
from driver.policy import suspicion
from driver.policy.decisions import Book, HostLost, Kill, Probe, Report, Wait
from driver.policy.memory.failures import FailureBook
from driver.policy.memory.progress import ProgressBook
from driver.policy.memory.rounds import RoundBook
from rendezvous.schema.workers import FailureRecord
from tests.driver.policy.builders import S, kinds, plan_of, rec, table

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


# ----------------------------------------------------------------------------- reports and probes


def test_an_accused_member_silent_itself_is_killed_after_the_confirm_window():
    """A stopped or hung member cannot report: its peers' word is confirmed by its own
    silence for CONFIRM_WINDOW, then it is killed."""
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(3, a, b)
    t = table(a, b, rec("c", 2, state=S.STOPPING))
    window = suspicion.CONFIRM_WINDOW

    def report(suspect, round_id, reporter="a"):
        return FailureRecord(reporter, round_id, "timeout", suspect)

    said = Report(ev.FailureReported(reporter="a", round=3, reason="timeout", suspect="b"))
    decisions, book = suspicion.failure_reported(t, p, Book.start(0.0), report("b", 3), 10.0)
    assert decisions == (said,) and book.failures.reporters == {"a"}
    assert [w for w, *_ in book.failures.accused] == ["b"]
    waiting, book = suspicion.accusations_due(t, book, 10.0 + window / 2)
    assert kinds(waiting) == [Wait] and len(book.failures.accused) == 1
    killed, book = suspicion.accusations_due(t, book, 10.0 + window)
    (kill,) = killed
    assert isinstance(kill, Kill) and kill.worker_id == "b"
    assert "reported nothing itself" in kill.reason and book.failures.accused == ()
    for other in (report("b", 2), report("c", 3), report("zz", 3), report(None, 3)):
        assert (
            suspicion.failure_reported(t, p, Book.start(0.0), other, 10.0)[1].failures.accused == ()
        )
    assert suspicion.failure_reported(t, None, Book.start(0.0), report("b", 3), 10.0)[
        1
    ] == Book.start(0.0)


def test_two_live_members_blaming_each_other_are_both_spared():
    """Healthy workers kept apart (a crowded listener) blame each other: each report
    shows its reporter alive, so nobody holding the newest commit is killed on it."""
    a, b = rec("a", 0), rec("b", 1)
    p = plan_of(3, a, b)
    t = table(a, b)
    a_blames_b = FailureRecord("a", 3, "did not connect", "b")
    b_blames_a = FailureRecord("b", 3, "did not connect", "a")
    _, book = suspicion.failure_reported(t, p, Book.start(0.0), a_blames_b, 10.0)
    _, book = suspicion.failure_reported(t, p, book, b_blames_a, 10.1)
    assert book.failures.reporters == {"a", "b"} and book.failures.accused == ()
    assert suspicion.accusations_due(t, book, 60.0)[0] == ()
    assert book.new_round().failures.reporters == frozenset()


def test_a_silent_member_gets_its_host_probed_once_never_killed_on_that_word():
    a, b = rec("a", 0, host="h1"), rec("b", 1, host="h2")
    p = plan_of(3, a, b)
    t = table(a, b, rec("c", 2, host="h2", state=S.STOPPING))

    def silent(suspect, round_id=3, reporter="a"):
        return FailureRecord(reporter, round_id, "silent for 0.9s", suspect, silent=True)

    decisions, book = suspicion.silence_reported(t, p, Book.start(0.0), silent("b"))
    assert decisions[1:] == (Probe("h2", "h2:7001"),) and book.failures.probing == {"h2"}
    assert not any(isinstance(d, Kill) for d in decisions)
    # The other neighbour says the same while the probe runs: one probe per host.
    again, book = suspicion.silence_reported(t, p, book, silent("b", reporter="c"))
    assert kinds(again) == [Report] and book.failures.probing == {"h2"}
    for report in (silent("b", round_id=2), silent("c"), silent("zz"), silent(None)):
        assert kinds(suspicion.silence_reported(t, p, Book.start(0.0), report)[0]) == [Report]
    assert kinds(suspicion.silence_reported(t, None, Book.start(0.0), silent("b"))[0]) == [Report]


def test_an_unreachable_host_is_lost_with_every_worker_running_there():
    a, b = rec("a", 0, host="h1"), rec("b", 1, host="h2")
    t = table(
        a, b, rec("c", 2, host="h2", state=S.UNREGISTERED), rec("d", 3, host="h2", state=S.FAILED)
    )
    probing = Book(RoundBook(0.0), failures=FailureBook(probing=frozenset({"h2", "h3"})))
    answered, book = suspicion.probe_answered(t, probing, "h2", True, "accepted")
    assert answered == () and book.failures.probing == {"h3"}
    lost, book = suspicion.probe_answered(t, probing, "h2", False, "no answer within 0.5s")
    assert book.failures.probing == {"h3"}
    assert lost == (
        Report(ev.HostUnreachable("h2", "no answer within 0.5s", ["b", "c"])),
        HostLost("h2", "no answer within 0.5s"),
        Kill("b", "its host h2 is unreachable (no answer within 0.5s)"),
        Kill("c", "its host h2 is unreachable (no answer within 0.5s)"),
    )


# ----------------------------------------------------------------------------- a stopped member


def test_a_report_of_the_ring_a_handover_replaced_accuses_its_suspect():
    """A member stops (SIGSTOP) and newcomers register: the round that grows by them is
    a handover, published before the stopped member's neighbour reports it on the old
    ring, where the members still train. That report accuses it: dropped, nobody would
    ever blame it (in the new round its neighbours wait for it to connect, and their
    other neighbours report them instead, round after round)."""
    x, y, n = rec("x", 0), rec("y", 1), rec("n", 2)
    old = plan_of(13, x, y)
    grown = dataclasses.replace(plan_of(14, x, y, n), handover=True)
    t = table(x, y, n)
    book = Book.start(0.0).new_round(13).new_round(14, handover=True)
    lost = FailureRecord("y", 13, "rank 0 lost: no heartbeat for 3.0 s", suspect="x")
    _, accused = suspicion.failure_reported(t, grown, book, lost, 10.0)
    assert [a.worker_id for a in accused.failures.accused] == ["x"]
    (kill,) = suspicion.accusations_due(t, accused, 10.0 + suspicion.CONFIRM_WINDOW).decisions
    assert isinstance(kill, Kill) and kill.worker_id == "x"
    # Of a round the members no longer run (an older one, or before a round that was
    # no handover): noted only.
    older = dataclasses.replace(lost, round_id=12)
    assert suspicion.failure_reported(t, grown, book, older, 10.0)[1].failures.accused == ()
    plain = Book.start(0.0).new_round(13).new_round(14)
    regrown = plan_of(14, x, y, n)
    assert suspicion.failure_reported(t, regrown, plain, lost, 10.0)[1].failures.accused == ()
    # A member accused on the old ring stays accused when a handover is published.
    _, before = suspicion.failure_reported(t, old, Book.start(0.0).new_round(13), lost, 9.0)
    assert [a.worker_id for a in before.new_round(14, True).failures.accused] == ["x"]
    assert before.new_round(14).failures.accused == ()


def progress_of(writer: str, at: float, round_id: int = 13) -> Book:
    book = Book.start(0.0)
    heard = ProgressBook(step=100, round_id=round_id, at=at).written_by(writer)
    return dataclasses.replace(book, progress=heard)


def test_a_rank_0_not_heard_for_the_peer_timeout_is_killed():
    """Rank 0 writes its progress every period from a thread of its own, whatever its
    training does: still rank 0 of the round and silent for ``after``, it is stopped
    or hung. Its ring peers' word may never come (its neighbours wait in the next
    round's setup for it, and are the ones reported): the driver's own record decides."""
    x, y, n = rec("x", 0), rec("y", 1), rec("n", 2)
    p = plan_of(20, x, y, n)
    t = table(x, y, n)
    after = 10.0
    book = progress_of("x", at=5.0)
    (wait,) = suspicion.silent_rank0(t, p, book, 14.0, after).decisions
    assert wait == Wait(15.0, "rank 0 (x) to be heard")
    (kill,) = suspicion.silent_rank0(t, p, book, 15.5, after).decisions
    assert isinstance(kill, Kill) and kill.worker_id == "x"
    assert "rank 0 of round 20" in kill.reason and "not heard for 10 s" in kill.reason
    # Nobody else is blamed for it: not a rank 0 that has not written yet (the last
    # record is an old rank 0's), not one already given up on, not after the finish.
    assert suspicion.silent_rank0(t, plan_of(21, y, n), book, 60.0, after).decisions == ()
    killed = table(dataclasses.replace(x, state=S.KILLED), y, n)
    assert suspicion.silent_rank0(killed, p, book, 60.0, after).decisions == ()
    done = book.training_finished(6.0)
    assert suspicion.silent_rank0(t, p, done, 60.0, after).decisions == ()
    assert suspicion.silent_rank0(t, p, Book.start(0.0), 60.0, after).decisions == ()


def test_a_store_that_stalls_holds_rank_0s_records_back_and_kills_nobody():
    """The store did not answer the driver in time until 30.0 (an etcd stalled): rank 0's
    records come again once it answers, so its silence counts from there."""
    x, y = rec("x", 0), rec("y", 1)
    p, t = plan_of(20, x, y), table(x, y)
    book = progress_of("x", at=5.0)
    (wait,) = suspicion.silent_rank0(t, p, book, 31.0, 10.0, store_trouble_at=30.0).decisions
    assert wait == Wait(40.0, "rank 0 (x) to be heard")
    (kill,) = suspicion.silent_rank0(t, p, book, 40.0, 10.0, store_trouble_at=30.0).decisions
    assert isinstance(kill, Kill) and "not heard for 35 s" in kill.reason


def test_rank_0s_silence_is_the_workers_peer_timeout_ten_seconds_at_least():
    after = suspicion.rank0_silence_after
    assert after({}) == suspicion.PEER_TIMEOUT_DEFAULT
    assert after({"ELASTIC_PEER_TIMEOUT": "3"}) == suspicion.RANK0_SILENT_MIN
    assert after({"ELASTIC_PEER_TIMEOUT": "45"}) == 45.0
    assert after({"ELASTIC_PEER_TIMEOUT": "soon"}) == suspicion.PEER_TIMEOUT_DEFAULT
