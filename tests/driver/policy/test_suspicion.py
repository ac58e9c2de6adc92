"""Who is dead (``driver.policy.suspicion``): failure reports and silent peers turned
into host probes and kills, checked decision by decision."""

from __future__ import annotations

import pytest

from driver import events as ev
from driver.policy import suspicion
from driver.policy.decisions import Book, HostLost, Kill, Probe, Report, Wait
from driver.policy.memory.failures import FailureBook
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
