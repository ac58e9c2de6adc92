"""The picture of a run drawn from its events file (``python -m runplot``): the timeline
(pure), the matplotlib rendering, and the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from driver import events as ev
from driver.errors import PlotError
from runplot.__main__ import plot
from runplot.render import STYLE
from runplot.timeline import build_timeline, load_events, marker_rows, summary
from tests.support.paths import ROOT

SVG = "{http://www.w3.org/2000/svg}"


def sample_events() -> list[dict]:
    """A run: 4 workers, a chaos kill and recovery, a host joining then blacklisted, a ps
    restart, checkpoints with steps, and the end of the job."""
    out = []
    t0 = 1_700_000_000.0

    def e(x, cls, **fields):
        out.append({"t": t0 + x, "elapsed": x, "kind": cls.kind, **fields})

    for s in range(4):
        e(0.1, ev.WorkerStarted, host="localhost", slot=s, pid=100 + s)
    e(1.0, ev.RoundFormed, round=1, size=4, seconds=0.9)
    e(5.0, ev.CheckpointWritten, step=100)
    e(6.0, ev.ChaosKill, host="localhost", slot=2, rank=2, pid=102, step=120)
    e(6.1, ev.WorkerFailed, host="localhost", slot=2, rank=2, code=-9, reason="killed")
    e(6.6, ev.RoundFormed, round=2, size=3, seconds=0.5)
    e(7.0, ev.WorkerStarted, host="localhost", slot=2, pid=200)
    e(8.0, ev.RoundFormed, round=3, size=4, seconds=0.3)
    e(10.0, ev.HostAdded, host="node-b", slots=2)
    e(10.2, ev.WorkerStarted, host="node-b", slot=0, pid=300)
    e(10.2, ev.WorkerStarted, host="node-b", slot=1, pid=301)
    e(11.0, ev.RoundFormed, round=4, size=6, seconds=0.8, step=250)
    e(14.0, ev.WorkerFailed, host="node-b", slot=1, rank=5, code=1)
    e(14.1, ev.HostBlacklisted, host="node-b", cooldown=30, reason="worker failed")
    e(14.2, ev.WorkerStopped, host="node-b", slot=0, code=-15)
    e(14.8, ev.RoundFormed, round=5, size=4, seconds=0.6)
    e(15.0, ev.CheckpointWritten, step=400)
    e(16.0, ev.PsExited, shard=0, code=-9)
    e(16.5, ev.PsRestarted, shard=0, step=400)
    for s in range(4):
        e(20.0, ev.WorkerExited, host="localhost", slot=s, rank=s, code=0)
    e(20.1, ev.JobDone, rounds=5, seconds=20.1, step=520)
    return out


def write_events(path: Path, records, torn: bool = True) -> None:
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write("not json\n[1, 2]\n")
        if torn:
            f.write('{"t": 1700000021.0, "elapsed": 21.0, "ki')  # a crash mid-line


def svg_texts(path: Path) -> list[str]:
    root = ET.fromstring(path.read_text())  # well-formed, escaped
    assert root.tag == f"{SVG}svg"
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


# ----------------------------------------------------------------------------- timeline


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
    assert [m.kind for m in tl.markers] == [
        "chaos_kill",
        "worker_failed",
        "host_added",
        "worker_failed",
        "host_blacklisted",
        "ps_exited",
        "ps_restarted",
        "job_done",
    ]
    assert tl.outcome == "done" and tl.duration == 20.1
    assert summary(tl) == (
        "5 rounds, 2 worker failures, 1 chaos kill, 1 blacklisting, "
        "1 ps restart, last step 520; job done after 20s"
    )


def test_elapsed_is_derived_from_t_when_missing(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(
        '{"t": 100.0, "kind": "round_formed", "round": 1, "size": 2}\n'
        '{"t": 102.5, "kind": "job_failed", "reason": "reset limit"}\n'
    )
    tl = build_timeline(load_events(path)[0])
    assert tl.world == ((0.0, 2),) and tl.duration == 2.5
    assert tl.outcome == "failed: reset limit"


def test_crowded_markers_stack_in_lanes():
    assert marker_rows([0, 5, 30, 31, 32, 33, 34]) == [0, 1, 0, 1, 2, 3, 0]


def test_every_marker_kind_has_its_own_look():
    looks = [(colour, shape, filled) for colour, shape, filled, _ in STYLE.values()]
    assert len(set(looks)) == len(looks)
    assert len({legend for *_, legend in STYLE.values()}) == len(STYLE)


# ----------------------------------------------------------------------------- picture


def test_svg_picture_of_a_run(tmp_path):
    path = tmp_path / "run.jsonl"
    write_events(path, sample_events())
    written = plot(path, tmp_path / "run.svg", title="chaos <run> & co")
    assert written == tmp_path / "run.svg"
    texts = svg_texts(written)
    assert "chaos <run> & co" in texts
    assert any(t.startswith("5 rounds, 2 worker failures") for t in texts)
    assert {"r1", "r2", "r3", "r4", "r5", "committed step", "workers"} <= set(texts)
    assert {"chaos kill", "worker failed", "host blacklisted", "job done"} <= set(texts)


def test_svg_without_steps_or_rounds(tmp_path):
    path = tmp_path / "run.jsonl"
    write_events(
        path,
        [
            {"elapsed": 0.5, "kind": "waiting", "what": "workers"},
            {"elapsed": 3.0, "kind": "job_failed", "reason": "start timeout"},
        ],
        torn=False,
    )
    texts = svg_texts(plot(path, tmp_path / "run.svg"))
    assert "no round formed" in texts and "committed step" not in texts
    assert "job failed" in texts


def run_plot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runplot", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_without_matplotlib(*args: str) -> subprocess.CompletedProcess:
    """``python -m runplot ARGS`` in a Python where ``import matplotlib`` fails."""
    hide = "import sys, runpy; sys.modules['matplotlib'] = None; "
    hide += "runpy.run_module('runplot', run_name='__main__')"
    return subprocess.run(
        [sys.executable, "-c", hide, *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_plot_command_line(tmp_path):
    path = tmp_path / "run.jsonl"
    write_events(path, sample_events())
    done = run_plot(str(path), "-o", str(tmp_path / "run.png"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    default = run_plot(str(path))
    assert default.returncode == 0 and (tmp_path / "run.svg").exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    failed = run_plot(str(empty))
    assert failed.returncode == 1 and "no events" in failed.stderr
    with pytest.raises(PlotError):
        plot(tmp_path / "missing.jsonl")


def test_without_matplotlib_one_line_and_no_file(tmp_path):
    path = tmp_path / "run.jsonl"
    write_events(path, sample_events())
    done = run_without_matplotlib(str(path), "-o", str(tmp_path / "x.svg"))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "matplotlib is not installed" in lines[0], done.stderr
    assert not (tmp_path / "x.svg").exists()


# ----------------------------------------------------------------------------- runs, ps steps


def test_a_file_of_several_runs_is_split_and_the_last_one_drawn(tmp_path):
    first = [
        {"t": 1.0, "elapsed": 0.0, "kind": "job_started", "job_id": "a"},
        {"t": 2.0, "elapsed": 1.0, "kind": "round_formed", "round": 1, "size": 2},
        {"t": 9.0, "elapsed": 8.0, "kind": "job_done", "round": 1, "size": 2},
    ]
    # a run that failed before it started (no job_started), then a third run
    refused = [{"t": 20.0, "elapsed": 0.1, "kind": "job_failed", "reason": "discovery"}]
    last = [
        {"t": 30.0, "elapsed": 0.0, "kind": "host_added", "host": "h", "slots": 3},
        {"t": 30.1, "elapsed": 0.1, "kind": "job_started", "job_id": "c"},
        {"t": 31.0, "elapsed": 1.0, "kind": "round_formed", "round": 1, "size": 3},
        {"t": 32.0, "elapsed": 2.0, "kind": "job_failed", "reason": "stopped by SIGTERM"},
    ]
    from runplot.timeline import split_runs

    runs = split_runs(first + refused + last)
    assert [len(r) for r in runs] == [3, 1, 1, 3]
    assert runs[-1][0]["kind"] == "job_started" and runs[-1][0]["job_id"] == "c"
    path = tmp_path / "runs.jsonl"
    write_events(path, first + refused + last, torn=False)
    texts = svg_texts(plot(path, tmp_path / "runs.svg"))
    assert any("the last of 4 runs" in t for t in texts)
    assert any(t.startswith("1 round") and "failed: stopped by SIGTERM" in t for t in texts)


def ps_events() -> list[dict]:
    """A ps job: the only steps are the checkpoints'; a shard dies after the ps reached
    step 430 (a progress report) and restarts from the checkpoint of step 400."""

    def e(x, cls, **fields):
        return {"t": 1_700_000_000.0 + x, "elapsed": x, "kind": cls.kind, **fields}

    return [
        e(1.0, ev.RoundFormed, round=1, size=2, seconds=0.5),
        e(5.0, ev.CheckpointWritten, step=200, checkpoint=1),
        e(9.0, ev.CheckpointWritten, step=400, checkpoint=2),
        e(10.0, ev.PsExited, shard=1, code=-9),
        e(10.5, ev.PsRestarted, shard=1, step=400),
        e(14.0, ev.CheckpointWritten, step=600, checkpoint=3),
    ]


def test_ps_steps_are_labelled_as_checkpoint_steps_and_restarts_shown(tmp_path):
    tl = build_timeline(ps_events())
    assert tl.steps_are_checkpoints and tl.restarts == ((10.5, 400),) and not tl.rollbacks
    assert "last checkpoint step 600" in summary(tl)
    path = tmp_path / "ps.jsonl"
    write_events(path, ps_events(), torn=False)
    texts = svg_texts(plot(path, tmp_path / "ps.svg"))
    assert {"checkpoint step", "ps restart from checkpoint"} <= set(texts)
    assert "committed step" not in texts


def test_a_step_that_goes_back_is_a_rollback(tmp_path):
    events = ps_events()
    events.insert(3, {"elapsed": 9.9, "kind": "progress", "round": 1, "size": 2, "step": 430})
    tl = build_timeline(events)
    assert not tl.steps_are_checkpoints
    assert tl.rollbacks == ((10.5, 400),)  # the restart went back below step 430
    assert summary(tl).endswith(
        "1 ps restart, last step 600, 1 rollback; no end recorded after 14s"
    )
    path = tmp_path / "ps.jsonl"
    write_events(path, events, torn=False)
    texts = svg_texts(plot(path, tmp_path / "ps.svg"))
    assert {"committed step", "rollback", "back to 400"} <= set(texts)


def test_without_matplotlib_an_existing_picture_is_left_alone(tmp_path):
    """``-o run.png`` without matplotlib: one line, exit 1, no run.png, and the run.svg
    next to the events file untouched."""
    path = tmp_path / "run.jsonl"
    write_events(path, sample_events())
    old = tmp_path / "run.svg"
    old.write_text("<svg/>")
    done = run_without_matplotlib(str(path), "-o", str(tmp_path / "run.png"))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "matplotlib is not installed" in lines[0], done.stderr
    assert not (tmp_path / "run.png").exists() and old.read_text() == "<svg/>"
