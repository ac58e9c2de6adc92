"""What a worker tells the driver about a failure (``elastic.worker_reports``): whom it blames
is decided by the loss's cause as a value (``LossCause``), never by the words of the
exception's message."""

from __future__ import annotations

import threading

import pytest

import elastic
from elastic import errors
from elastic.errors import LossCause, PeerLostError, WorkerLostError
from elastic.worker_reports import (
    failure_record,
    publish_progress,
    silence_report,
    suspect_of,
    worth_reporting,
)
from rendezvous.host_plan import RoundView, view_of
from rendezvous.keys import JobKeys
from rendezvous.schema.rounds import Member, Plan
from rendezvous.schema.workers import FailureRecord, ProgressRecord
from rendezvous.store_reach import StoreReach

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


def plan_of(*ids: str) -> RoundView:
    """Round 5 of ``ids`` on one host, as that host reads it."""
    members = tuple(
        Member(w, "h", i, f"127.0.0.1:{7000 + i}", i, i, len(ids), 0, 1) for i, w in enumerate(ids)
    )
    return view_of(Plan(5, members), "h")


PLAN = plan_of("a", "b", "c")


def test_a_neighbour_seen_silent_is_the_suspect_whatever_the_message_says():
    for message in ("rank 1 lost: no heartbeat for 30.0 s", "rank 1 went quiet (reworded)", ""):
        exc = PeerLostError(message, rank=1, direct=True, cause=LossCause.SILENT)
        assert suspect_of(exc, PLAN) == "b"


@pytest.mark.parametrize("cause", [LossCause.CLOSED, LossCause.RELAYED, LossCause.UNKNOWN])
def test_a_crash_or_hearsay_blames_nobody_even_with_silent_words(cause):
    exc = PeerLostError("rank 1 lost: no heartbeat (did not answer)", 1, True, cause)
    assert suspect_of(exc, PLAN) is None


def test_a_loss_heard_from_another_member_is_not_reported_again():
    relayed = PeerLostError("rank 1 lost (seen by rank 2)", rank=1, cause=LossCause.RELAYED)
    assert not worth_reporting(relayed)
    for cause in (LossCause.CLOSED, LossCause.SILENT, LossCause.UNKNOWN):
        assert worth_reporting(PeerLostError("x", rank=1, direct=True, cause=cause))
    assert worth_reporting(WorkerLostError("rank 1 lost"))


def test_only_a_loss_seen_here_of_a_member_of_the_plan_names_a_suspect():
    silent = LossCause.SILENT
    assert suspect_of(PeerLostError("x", rank=1, direct=False, cause=silent), PLAN) is None
    assert suspect_of(PeerLostError("x", rank=None, direct=True, cause=silent), PLAN) is None
    assert suspect_of(PeerLostError("x", rank=9, direct=True, cause=silent), PLAN) is None
    assert suspect_of(PeerLostError("x", rank=1, direct=True, cause=silent), None) is None
    assert suspect_of(WorkerLostError("rank 1 lost: no heartbeat"), PLAN) is None


def test_the_reports_are_the_typed_records_the_driver_reads():
    record = FailureRecord.from_json(failure_record("a", 5, "rank 1 lost", "b"))
    assert record == FailureRecord("a", 5, "rank 1 lost", "b")
    report = silence_report(JobKeys("j"), "a", PLAN, 2, 1.25)
    assert report is not None
    key, data = report
    assert key == JobKeys("j").silence(5, "a", "c")
    assert FailureRecord.from_json(data) == FailureRecord("a", 5, "silent for 1.2s", "c", True)


def test_every_public_error_is_on_the_package_face_and_defined_in_errors():
    for name in errors.__all__:
        assert getattr(elastic, name) is getattr(errors, name)
        assert name in elastic.__all__
    assert elastic.PeerLostError.__module__ == "elastic.errors"
    assert issubclass(elastic.PeerLostError, elastic.WorkerLostError)


def test_the_face_exports_what_it_names_and_nothing_it_lacks():
    assert len(set(elastic.__all__)) == len(elastic.__all__)
    for name in elastic.__all__:
        assert hasattr(elastic, name), name


class Recorder:
    """A store that keeps what is put, and says when ``wanted`` puts came."""

    def __init__(self, wanted: int):
        self.puts: list[ProgressRecord] = []
        self.wanted = wanted
        self.enough = threading.Event()

    def put(self, key: str, value: bytes, lease: object = None) -> None:
        self.puts.append(ProgressRecord.from_json(value))
        if len(self.puts) >= self.wanted:
            self.enough.set()


class Rank0:
    """What ``publish_progress`` reads of a runtime: rank 0 of round 5, 7 commits."""

    def __init__(self, store: Recorder):
        self.store = store
        self.keys = JobKeys("j")
        self.committed = 7
        self.commit_round = 4
        self.member = PLAN.members[0]
        self.round_id = 5
        self.store_reach = StoreReach()  # (each write is a look at the store)


def test_rank_0_rewrites_its_step_every_second_even_unchanged():
    """Under a 10 s --progress-interval rank 0 still writes every ``progress_period``
    (a second): the driver's line every 10 s is then a second old at most (not up to a
    whole interval, the same step said across rounds), and a step that stands still is
    told from a rank 0 the driver cannot hear."""
    store, closed = Recorder(wanted=2), threading.Event()
    runtime = Rank0(store)
    thread = threading.Thread(
        target=publish_progress, args=(runtime, "a", 10.0, closed), daemon=True
    )
    thread.start()
    try:
        assert store.enough.wait(timeout=5), store.puts
    finally:
        closed.set()
        thread.join(timeout=5)
    assert store.puts[:2] == [ProgressRecord(7, 5, "a", commit_round=4)] * 2
    assert runtime.store_reach.away_for() == 0.0  # (answered: rank 0 snapshots with the others)
