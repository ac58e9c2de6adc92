"""The event log (JSON lines + readable stderr lines) and the picture drawn from it."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from driver import events as ev
from driver.events import EventError, EventLog, EventLogError, describe_code, format_event
from driver.plot import (PlotError, build_timeline, load_events, marker_rows, nice_ticks, plot,
                         render_svg, summary)

ROOT = Path(__file__).resolve().parent.parent
SVG = "{http://www.w3.org/2000/svg}"


# ----------------------------------------------------------------------------- EventLog


def test_event_log_writes_json_lines_and_text(tmp_path):
    path = tmp_path / "events.jsonl"
    stream = io.StringIO()
    log = EventLog(str(path), stream=stream)
    log.emit(ev.ROUND_FORMED, round=3, size=4, seconds=0.42)
    log.emit(ev.WORKER_STARTED, host="h", slot=0, pid=12)          # quiet: file only
    log.emit(ev.WORKER_FAILED, host="h", slot=1, rank=2, code=-9, reason="lease expired")
    log.emit(ev.WAITING, what="2 more workers (have 2 of 4)", waited=12.5)
    log.emit(ev.CHECKPOINT_WRITTEN, step=120, path={"odd": {1, 2}}, ratio=float("nan"))
    # Flushed per line: complete before close, as a crashed driver would leave it.
    records = [json.loads(line) for line in path.read_text().splitlines()]
    log.close()
    assert [r["kind"] for r in records] == [ev.ROUND_FORMED, ev.WORKER_STARTED, ev.WORKER_FAILED,
                                           ev.WAITING, ev.CHECKPOINT_WRITTEN]
    assert records[0]["round"] == 3 and records[0]["size"] == 4
    assert all(isinstance(r["t"], float) and r["t"] > 1e9 for r in records)
    elapsed = [r["elapsed"] for r in records]
    assert elapsed == sorted(elapsed) and 0 <= elapsed[0] < 5
    assert records[4]["ratio"] is None and records[4]["path"] == {"odd": [1, 2]}
    assert stream.getvalue().splitlines() == [
        "elastic-run: round 3 formed: 4 workers in 0.42s",
        "elastic-run: worker [2] h:1 failed (killed by SIGKILL): lease expired",
        "elastic-run: waiting for 2 more workers (have 2 of 4) (12s so far)",
    ]


def test_verbose_shows_routine_events_and_no_file_is_fine():
    stream = io.StringIO()
    log = EventLog(None, stream=stream, verbose=True)
    record = log.emit(ev.WORKER_STARTED, host="n1", slot=3, pid=77)
    assert record["kind"] == ev.WORKER_STARTED and record["pid"] == 77
    assert stream.getvalue() == "elastic-run: worker n1:3 started (pid 77)\n"


def test_emit_rejects_unknown_kinds_and_reserved_fields(tmp_path):
    log = EventLog(str(tmp_path / "e.jsonl"), stream=io.StringIO())
    with pytest.raises(EventError, match="unknown event kind"):
        log.emit("round_fromed", round=1)
    with pytest.raises(EventError, match="reserved"):
        log.emit(ev.JOB_DONE, elapsed=3)
    assert (tmp_path / "e.jsonl").read_text() == ""


def test_unwritable_events_file_is_a_typed_error(tmp_path):
    with pytest.raises(EventLogError, match="cannot open the events file"):
        EventLog(str(tmp_path / "missing-dir" / "e.jsonl"))


def test_concurrent_emits_leave_whole_lines(tmp_path):
    path = tmp_path / "e.jsonl"
    log = EventLog(str(path), stream=io.StringIO())

    def emit_many(i):
        for n in range(200):
            log.emit(ev.CHECKPOINT_WRITTEN, step=n, writer=i, pad="p" * 300)

    threads = [threading.Thread(target=emit_many, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 800
    for i in range(4):
        assert [r["step"] for r in records if r["writer"] == i] == list(range(200))


def test_every_kind_has_a_readable_text():
    assert ev.KINDS == set(ev.FIELDS)
    for kind in ev.KINDS:
        text = format_event(kind, {f: 1 for f in ev.FIELDS[kind]})
        assert text and "\n" not in text
        assert format_event(kind, {})  # missing fields never raise
    assert format_event(ev.HOST_BLACKLISTED, {"host": "n2", "cooldown": 30, "reason": "3 failures",
                                              "extra": "x"}) == \
        "host n2 blacklisted for 30s: 3 failures (extra=x)"
    assert describe_code(0) == "exit 0" and describe_code(-15) == "killed by SIGTERM"
    assert describe_code(-99) == "killed by signal 99" and describe_code(None) == "code None"


# ----------------------------------------------------------------------------- plot


def sample_events() -> list[dict]:
    """A run: 4 workers, a chaos kill and recovery, a host joining then blacklisted, a ps
    restart, checkpoints with steps, and the end of the job."""
    out = []
    t0 = 1_700_000_000.0

    def e(x, kind, **fields):
        out.append({"t": t0 + x, "elapsed": x, "kind": kind, **fields})

    for s in range(4):
        e(0.1, ev.WORKER_STARTED, host="localhost", slot=s, pid=100 + s)
    e(1.0, ev.ROUND_FORMED, round=1, size=4, seconds=0.9)
    e(5.0, ev.CHECKPOINT_WRITTEN, step=100)
    e(6.0, ev.CHAOS_KILL, host="localhost", slot=2, rank=2, pid=102, step=120)
    e(6.1, ev.WORKER_FAILED, host="localhost", slot=2, rank=2, code=-9, reason="killed")
    e(6.6, ev.ROUND_FORMED, round=2, size=3, seconds=0.5)
    e(7.0, ev.WORKER_STARTED, host="localhost", slot=2, pid=200)
    e(8.0, ev.ROUND_FORMED, round=3, size=4, seconds=0.3)
    e(10.0, ev.HOST_ADDED, host="node-b", slots=2)
    e(10.2, ev.WORKER_STARTED, host="node-b", slot=0, pid=300)
    e(10.2, ev.WORKER_STARTED, host="node-b", slot=1, pid=301)
    e(11.0, ev.ROUND_FORMED, round=4, size=6, seconds=0.8, step=250)
    e(14.0, ev.WORKER_FAILED, host="node-b", slot=1, rank=5, code=1)
    e(14.1, ev.HOST_BLACKLISTED, host="node-b", cooldown=30, reason="worker failed")
    e(14.2, ev.WORKER_STOPPED, host="node-b", slot=0, code=-15)
    e(14.8, ev.ROUND_FORMED, round=5, size=4, seconds=0.6)
    e(15.0, ev.CHECKPOINT_WRITTEN, step=400)
    e(16.0, ev.PS_EXITED, shard=0, code=-9)
    e(16.5, ev.PS_RESTARTED, shard=0, step=400)
    for s in range(4):
        e(20.0, ev.WORKER_EXITED, host="localhost", slot=s, rank=s, code=0)
    e(20.1, ev.JOB_DONE, rounds=5, seconds=20.1, step=520)
    return out


def write_events(path: Path, records, torn: bool = True) -> None:
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write("not json\n[1, 2]\n")
        if torn:
            f.write('{"t": 1700000021.0, "elapsed": 21.0, "ki')  # a crash mid-line


def test_timeline_from_events(tmp_path):
    path = tmp_path / "run.jsonl"
    write_events(path, sample_events())
    events, skipped = load_events(path)
    assert skipped == 3 and len(events) == len(sample_events())
    tl = build_timeline(events)
    assert [s for _, s in tl.world] == [4, 3, 4, 6, 4]
    assert [r for _, r in tl.rounds] == [1, 2, 3, 4, 5]
    assert tl.live[-1] == (20.0, 0) and max(n for _, n in tl.live) == 6
    assert [s for _, s in tl.steps] == [100, 120, 250, 400, 520]  # the ps restart is no progress
    assert tl.checkpoints == ((5.0, 100), (15.0, 400))
    assert [m.kind for m in tl.markers] == [ev.CHAOS_KILL, ev.WORKER_FAILED, ev.HOST_ADDED,
                                           ev.WORKER_FAILED, ev.HOST_BLACKLISTED, ev.PS_EXITED,
                                           ev.PS_RESTARTED, ev.JOB_DONE]
    assert tl.outcome == "done" and tl.duration == 20.1
    assert summary(tl) == ("5 rounds, 2 worker failures, 1 chaos kill, 1 blacklisting, "
                           "1 ps restart, last step 520; job done after 20s")


def test_elapsed_is_derived_from_t_when_missing(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text('{"t": 100.0, "kind": "round_formed", "round": 1, "size": 2}\n'
                    '{"t": 102.5, "kind": "job_failed", "reason": "reset limit"}\n')
    tl = build_timeline(load_events(path)[0])
    assert tl.world == ((0.0, 2),) and tl.duration == 2.5
    assert tl.outcome == "failed: reset limit"


def test_pure_layout_helpers():
    assert nice_ticks(0, 20.1) == [0, 5, 10, 15, 20]
    assert nice_ticks(0, 7, integer=True, cover=True) == [0, 2, 4, 6, 8]
    assert nice_ticks(0, 520, integer=True, cover=True) == [0, 100, 200, 300, 400, 500, 600]
    assert nice_ticks(0, 6, integer=True) == [0, 1, 2, 3, 4, 5, 6]
    assert nice_ticks(0, 0) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert marker_rows([0, 5, 30, 31, 32, 33, 34]) == [0, 1, 0, 1, 2, 3, 0]


def test_svg_picture_of_a_run(tmp_path):
    path = tmp_path / "run.jsonl"
    write_events(path, sample_events())
    written = plot(path, tmp_path / "run.svg", title="chaos <run> & co")
    assert written == tmp_path / "run.svg"
    root = ET.fromstring(written.read_text())  # well-formed, escaped
    assert root.tag == f"{SVG}svg"
    texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
    assert "chaos <run> & co" in texts
    assert any(t.startswith("5 rounds, 2 worker failures") for t in texts)
    assert {"r1", "r2", "r3", "r4", "r5", "committed step", "workers"} <= set(texts)
    assert {"chaos kill", "worker failed", "host blacklisted", "job done"} <= set(texts)
    tooltips = ["".join(t.itertext()) for t in root.iter(f"{SVG}title")]
    assert any("chaos: killed worker [2] localhost:2" in t for t in tooltips)
    assert len(list(root.iter(f"{SVG}polyline"))) == 1  # the steps line


def test_svg_without_steps_or_rounds():
    tl = build_timeline([{"elapsed": 0.5, "kind": ev.WAITING, "what": "workers"},
                         {"elapsed": 3.0, "kind": ev.JOB_FAILED, "reason": "start timeout"}])
    root = ET.fromstring(render_svg(tl))
    texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
    assert "no round formed" in texts and "committed step" not in texts
    assert "job failed" in texts


def test_plot_command_line(tmp_path):
    path = tmp_path / "run.jsonl"
    write_events(path, sample_events())
    done = subprocess.run([sys.executable, "-m", "driver.plot", str(path), "-o",
                           str(tmp_path / "run.png")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    if (tmp_path / "run.png").exists():  # matplotlib is installed here
        assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:  # the normal case: no matplotlib, the SVG instead
        assert "matplotlib is not installed" in done.stderr
        ET.fromstring((tmp_path / "run.svg").read_text())
    default = subprocess.run([sys.executable, "-m", "driver.plot", str(path)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert default.returncode == 0 and (tmp_path / "run.svg").exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    failed = subprocess.run([sys.executable, "-m", "driver.plot", str(empty)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1 and "no events" in failed.stderr
    with pytest.raises(PlotError):
        plot(tmp_path / "missing.jsonl")
