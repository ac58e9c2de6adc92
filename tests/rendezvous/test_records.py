"""The records workers write for the driver (``rendezvous.schema.workers``): written and read
through one codec, refused whole when a field has the wrong type."""

from __future__ import annotations

import json

import pytest

from rendezvous.schema.workers import FailureRecord, FinishRecord

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


def test_a_failure_report_round_trips_through_its_codec():
    for record in (
        FailureRecord("w1", 3, "rank 2 lost: connection closed"),
        FailureRecord("w1", 3, "rank 2 did not answer", suspect="w7"),
        FailureRecord("w1", 4, "silent for 0.9s", suspect="w7", silent=True),
    ):
        assert FailureRecord.from_json(record.to_json()) == record


def test_a_report_from_a_newer_writer_keeps_what_this_reader_knows():
    data = json.dumps({"worker_id": "w1", "round_id": 3, "reason": "x", "extra": 1}).encode()
    assert FailureRecord.from_json(data) == FailureRecord("w1", 3, "x")


@pytest.mark.parametrize(
    "fields, bad",
    [
        ({"worker_id": 7, "round_id": 3, "reason": "x"}, "worker_id"),
        ({"worker_id": "w", "round_id": "3", "reason": "x"}, "round_id"),
        ({"worker_id": "w", "round_id": True, "reason": "x"}, "round_id"),
        ({"worker_id": "w", "round_id": 3, "reason": None}, "reason"),
        ({"worker_id": "w", "round_id": 3, "reason": "x", "suspect": 5}, "suspect"),
        ({"worker_id": "w", "round_id": 3, "reason": "x", "silent": "yes"}, "silent"),
    ],
)
def test_a_report_with_a_field_of_the_wrong_type_is_refused_naming_it(fields, bad):
    with pytest.raises(TypeError, match=f"failure report: bad {bad}"):
        FailureRecord.from_json(json.dumps(fields).encode())


def test_a_report_missing_a_field_is_refused():
    with pytest.raises(TypeError):
        FailureRecord.from_json(json.dumps({"worker_id": "w", "round_id": 3}).encode())


def test_a_long_reason_is_cut_to_one_line_of_the_events():
    record = FailureRecord("w", 3, "x" * 10_000)
    assert len(record.reason) == FailureRecord.MAX_REASON


def test_a_finish_record_round_trips():
    assert FinishRecord.from_json(FinishRecord(5, 120).to_json()) == FinishRecord(5, 120)
