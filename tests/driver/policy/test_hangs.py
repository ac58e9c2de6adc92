"""Hung workers (``driver.policy.hangs``): a worker's own hang report is said with its
stacks and turned into its kill; a report of a worker already given up on is not."""

from __future__ import annotations

import pytest

from driver import events as ev
from driver.policy import hangs
from driver.policy.decisions import Kill, Report
from rendezvous.schema.workers import FailureRecord
from tests.driver.policy.builders import S, plan_of, rec, table

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


def hung(worker: str, round_id: int = 3) -> FailureRecord:
    reason = "no collective for 3.2s (hang timeout 3s), training at train.py:12 in step"
    stacks = "Thread 'MainThread'\n  File \"train.py\", line 12, in step\n"
    return FailureRecord(worker, round_id, reason, worker, hung=True, stacks=stacks)


def test_a_hung_member_is_said_with_its_stacks_and_killed():
    a, b = rec("a", 0), rec("b", 1)
    report, plan = hung("b"), plan_of(3, a, b)
    said, kill = hangs.hang_reported(table(a, b), plan, report)
    assert isinstance(said, Report)
    assert said == Report(
        ev.WorkerHung(
            worker="b",
            host="h",
            slot=1,
            rank=1,
            round=3,
            reason=report.reason,
            stacks=report.stacks,
        )
    )
    assert kill == Kill("b", f"hung: {report.reason}")
    assert "train.py:12 in step" in str(said.event)


def test_a_hung_worker_is_killed_whatever_the_round_and_outside_any_round():
    """Its training thread never joins a newer round: the round it says is an older
    one's (a peer died meanwhile), and the newer round waits for it all the same; a
    worker that is in no round (the plan gone, a newcomer) is no less hung."""
    a, b = rec("a", 0), rec("b", 1)
    for plan, round_id, rank in ((plan_of(4, a, b), 3, 1), (None, 3, None)):
        said, kill = hangs.hang_reported(table(a, b), plan, hung("b", round_id))
        assert isinstance(said, Report) and isinstance(said.event, ev.WorkerHung)
        assert said.event.round == round_id and said.event.rank == rank
        assert kill == Kill("b", f"hung: {hung('b').reason}")


@pytest.mark.parametrize("state", [S.KILLED, S.STOPPING, S.CHAOS_KILLED, S.FAILED, S.STOPPED])
def test_a_worker_given_up_on_already_is_left_alone(state):
    """A report read again (a driver that took the job over reads every report) of a
    worker killed, stopping or gone says nothing and kills nobody."""
    a, b = rec("a", 0), rec("b", 1, state=state)
    assert hangs.hang_reported(table(a, b), plan_of(3, a), hung("b")) == ()


def test_a_report_of_an_unknown_worker_is_ignored():
    a = rec("a", 0)
    assert hangs.hang_reported(table(a), plan_of(3, a), hung("zz")) == ()


def test_the_hung_event_is_one_line_and_its_stacks_are_in_the_record():
    record = hung("b")
    again = FailureRecord.from_json(record.to_json())
    assert again == record and again.hung and again.stacks == record.stacks
    long = FailureRecord("b", 1, "x", "b", hung=True, stacks="s" * 100_000)
    assert len(long.stacks) == FailureRecord.MAX_STACKS
    with pytest.raises(TypeError, match="hung"):
        FailureRecord("b", 1, "x", "b", hung="yes")  # type: ignore[arg-type]
