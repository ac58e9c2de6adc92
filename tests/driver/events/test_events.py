"""The event vocabulary (typed events, their fields and readable text) and the event log
(JSON lines + readable stderr lines). The picture drawn from the log:
tests/runplot/test_runplot.py."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import threading
import types
import typing
from dataclasses import dataclass

import pytest

from driver import events as ev
from driver.errors import EventError, EventLogError
from driver.events import describe_code
from driver.events.log import EventLog

# ----------------------------------------------------------------------------- EventLog


def test_event_log_writes_json_lines_and_text(tmp_path):
    path = tmp_path / "events.jsonl"
    stream = io.StringIO()
    log = EventLog(str(path), stream=stream)
    log.emit(ev.RoundFormed(round=3, size=4, seconds=0.42, members=["a", "b", "c", "d"]))
    log.emit(ev.WorkerStarted(worker="h-0-1", host="h", slot=0, pid=12))  # quiet: file only
    log.emit(
        ev.WorkerFailed(worker="h-1-2", host="h", slot=1, rank=2, code=-9, reason="lease expired")
    )
    log.emit(ev.Waiting(what="2 more workers (have 2 of 4)", waited=12.5))
    # Values JSON cannot hold never crash the log (a set, a NaN).
    odd: typing.Any = {"odd": {1, 2}}
    log.emit(ev.CheckpointWritten(step=120, path=odd, seconds=float("nan"), checkpoint=7))
    # Flushed per line: complete before close, as a crashed driver would leave it.
    records = [json.loads(line) for line in path.read_text().splitlines()]
    log.close()
    assert [r["kind"] for r in records] == [
        "round_formed",
        "worker_started",
        "worker_failed",
        "waiting",
        "checkpoint_written",
    ]
    assert records[0]["round"] == 3 and records[0]["size"] == 4
    assert all(isinstance(r["t"], float) and r["t"] > 1e9 for r in records)
    elapsed = [r["elapsed"] for r in records]
    assert elapsed == sorted(elapsed) and 0 <= elapsed[0] < 5
    assert records[4]["seconds"] is None and records[4]["path"] == {"odd": [1, 2]}
    assert stream.getvalue().splitlines() == [
        "elastic-run: round 3 formed: 4 workers in 0.42s",
        "elastic-run: worker [2] h:1 failed (killed by SIGKILL): lease expired",
        "elastic-run: waiting for 2 more workers (have 2 of 4) (12s so far)",
    ]


def test_verbose_shows_routine_events_and_no_file_is_fine():
    stream = io.StringIO()
    log = EventLog(None, stream=stream, verbose=True)
    record = log.emit(ev.WorkerStarted(worker="n1-3-1", host="n1", slot=3, pid=77))
    assert record["kind"] == "worker_started" and record["pid"] == 77
    assert stream.getvalue() == "elastic-run: worker n1:3 started (pid 77)\n"


def test_emit_rejects_unknown_kinds_and_reserved_fields(tmp_path):
    log = EventLog(str(tmp_path / "e.jsonl"), stream=io.StringIO())
    with pytest.raises(EventError, match="unknown event kind"):
        log.emit("round_fromed")  # type: ignore[arg-type]
    with pytest.raises(EventError, match="reserved"):

        @dataclass(frozen=True)
        class Timed(ev.Event):
            kind: typing.ClassVar[str] = "timed"
            elapsed: float

    with pytest.raises(EventError, match="defined twice"):

        @dataclass(frozen=True)
        class Twin(ev.Event):
            kind: typing.ClassVar[str] = "job_done"

    assert (tmp_path / "e.jsonl").read_text() == ""


def test_unwritable_events_file_is_a_typed_error(tmp_path):
    with pytest.raises(EventLogError, match="cannot open the events file"):
        EventLog(str(tmp_path / "missing-dir" / "e.jsonl"))


def test_concurrent_emits_leave_whole_lines(tmp_path):
    path = tmp_path / "e.jsonl"
    log = EventLog(str(path), stream=io.StringIO())

    def emit_many(i):
        for n in range(200):
            log.emit(
                ev.CheckpointWritten(step=n, path=f"w{i}" + "p" * 300, seconds=0.1, checkpoint=i)
            )

    threads = [threading.Thread(target=emit_many, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 800
    for i in range(4):
        assert [r["step"] for r in records if r["checkpoint"] == i] == list(range(200))


# ----------------------------------------------------------------------------- vocabulary


def _sample(cls):
    """An instance of ``cls`` with a plausible value in every field."""
    values = {str: "x", int: 1, float: 1.5, bool: True}

    def value(hint):
        if hint in values:
            return values[hint]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
            return value(args[0])
        return [value(args[0])]  # Sequence[X]

    hints = typing.get_type_hints(cls)
    return cls(**{f.name: value(hints[f.name]) for f in dataclasses.fields(cls)})


def test_every_kind_has_a_class_and_a_readable_text():
    vocabulary = ev.vocabulary()
    assert set(vocabulary) == ev.KINDS and len(ev.KINDS) == 50
    for kind, cls in vocabulary.items():
        assert cls.kind == kind
        event = _sample(cls)
        record = EventLog(None, stream=io.StringIO()).emit(event)
        assert set(record) == {"t", "elapsed", "kind"} | {f.name for f in dataclasses.fields(cls)}
        text = str(event)
        assert text and "\n" not in text and not text.startswith("<")
    assert (
        str(ev.HostBlacklisted(host="n2", failures=3, strikes=1, cooldown=30.0, until=99.0))
        == "host n2 blacklisted for 30 s after 3 worker failure(s) (strike 1)"
    )
    assert describe_code(0) == "exit 0" and describe_code(-15) == "killed by SIGTERM"
    assert describe_code(-99) == "killed by signal 99" and describe_code(None) == "code None"


def test_events_carry_the_fields_readers_rely_on():
    """What tests, benchmarks and runplot read from the events file: the fields exist."""
    fields = {
        cls.kind: {f.name for f in dataclasses.fields(cls)} for cls in ev.vocabulary().values()
    }
    assert {"worker", "host", "slot", "pid"} <= fields["worker_started"]
    assert {"round", "size", "seconds", "members"} <= fields["round_formed"]
    assert {"worker", "host", "slot", "code", "rank", "chaos"} <= fields["worker_failed"]
    assert {"shard", "address", "pid"} <= fields["ps_started"]
    assert {"step", "path", "checkpoint"} <= fields["checkpoint_written"]
    assert {"checkpoint", "error", "attempts", "final", "newest"} <= fields["checkpoint_failed"]
    assert {"reporter", "round", "reason", "suspect"} <= fields["failure_reported"]
    assert {"host", "cooldown"} <= fields["host_blacklisted"]
    assert {"reason", "rounds", "seconds"} <= fields["job_failed"]
    assert "spare" in fields["worker_started"]
    assert {"worker", "host", "took"} <= fields["spare_ready"]
    assert {"worker", "host", "slot", "waited"} <= fields["spare_promoted"]
    assert {"worker", "host", "code", "registered"} <= fields["spare_lost"]
    assert {"step", "round", "path", "host", "seconds", "final"} <= fields["snapshot_written"]
    assert {"step", "path", "error"} <= fields["snapshot_failed"]
    assert {"step", "round", "path"} <= fields["snapshot_resumed"]
    assert {"round", "previous", "step"} <= fields["state_lost"]
    assert {"world", "restarts", "size", "hosts", "members", "seconds"} <= fields["world_started"]
    assert {"world", "reason", "failure"} <= fields["world_stopping"]
    assert "world" in fields["job_done"]


def test_the_events_file_is_appended_to_never_truncated(tmp_path):
    path = tmp_path / "events.jsonl"
    for run in range(2):
        with EventLog(str(path), stream=io.StringIO()) as log:
            log.emit(ev.JobStarted(f"job{run}", "embedded://h:1", 1, 1, 1, ["true"]))
            log.emit(ev.JobDone(round=1, size=1, resets=0))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["kind"], r.get("job_id")) for r in records] == [
        ("job_started", "job0"),
        ("job_done", None),
        ("job_started", "job1"),
        ("job_done", None),
    ]


def test_driver_lines_can_carry_a_timestamp():
    stream = io.StringIO()
    log = EventLog(None, stream=stream, timestamps=True)
    log.emit(ev.Waiting(what="workers", waited=3.0))
    line = stream.getvalue()
    assert re.fullmatch(
        r"elastic-run \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]: waiting for workers \(3.00s so far\)\n",
        line,
    ), line


def test_the_replica_and_rollback_lines_say_what_happened_to_the_steps():
    assert str(ev.PsFailedOver(1, "10.0.0.1:4001", "10.0.0.2:4002", 153)) == (
        "ps shard 1 failed over from 10.0.0.1:4001 to its backup on 10.0.0.2:4002 at "
        "step 153: no step lost"
    )
    assert str(ev.PsRolledBack(1, 180, 120, 60, checkpoint=4)) == (
        "ps shard 1 restarted from checkpoint 4 at step 120, behind the step 180 the "
        "shards had reached: 60 steps lost"
    )
    assert str(ev.PsBackupReady(0, "h:1", 77, 12)) == (
        "ps shard 0 has a backup in step on h:1 (pid 77, copied at step 12)"
    )
    assert str(ev.PsBackupExited(0, -9)) == (
        "the backup of ps shard 0 exited (killed by SIGKILL); starting another"
    )
