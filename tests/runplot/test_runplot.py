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
from rendezvous.version import package_version
from runplot.__main__ import plot
from runplot.render import STYLE
from runplot.timeline import build_timeline, load_events, marker_rows, split_runs, summary
from tests.support.jobs import WORKLOADS, ElasticRun
from tests.support.paths import ROOT

PS_LINEAR = WORKLOADS / "ps_linear.py"

SVG = "{http://www.w3.org/2000/svg}"


def sample_events() -> list[dict]:
    """A run: 4 workers, a chaos kill and recovery, a host joining then blacklisted, a ps
    restart, progress reports, checkpoints, and the end of the job."""
    out = []
    t0 = 1_700_000_000.0

    def e(x, cls, **fields):
        out.append({"t": t0 + x, "elapsed": x, "kind": cls.kind, **fields})

    def progress(x, rnd, size, step):
        e(x, ev.Progress, round=rnd, size=size, step=step, steps_per_second=None)

    e(0.0, ev.JobStarted, job_id="j", store="embedded", np=4, min_np=2, max_np=4, command=[])
    for s in range(4):
        e(0.1, ev.WorkerStarted, host="localhost", slot=s, pid=100 + s)
    e(1.0, ev.RoundFormed, round=1, size=4, seconds=0.9)
    progress(3.0, 1, 4, 60)
    e(5.0, ev.CheckpointWritten, step=100)
    e(6.0, ev.ChaosKill, worker="w2", host="localhost", slot=2, rank=2, pid=102, kill=1)
    e(6.1, ev.WorkerFailed, host="localhost", slot=2, rank=2, code=-9, reason="killed")
    e(6.6, ev.RoundFormed, round=2, size=3, seconds=0.5)
    e(7.0, ev.WorkerStarted, host="localhost", slot=2, pid=200)
    progress(7.5, 2, 3, 120)
    e(8.0, ev.RoundFormed, round=3, size=4, seconds=0.3)
    e(10.0, ev.HostAdded, host="node-b", slots=2)
    e(10.2, ev.WorkerStarted, host="node-b", slot=0, pid=300)
    e(10.2, ev.WorkerStarted, host="node-b", slot=1, pid=301)
    e(11.0, ev.RoundFormed, round=4, size=6, seconds=0.8)
    progress(12.0, 4, 6, 250)
    e(14.0, ev.WorkerFailed, host="node-b", slot=1, rank=5, code=1)
    e(14.1, ev.HostBlacklisted, host="node-b", cooldown=30, reason="worker failed")
    e(14.2, ev.WorkerStopped, host="node-b", slot=0, code=-15)
    e(14.8, ev.RoundFormed, round=5, size=4, seconds=0.6)
    e(15.0, ev.CheckpointWritten, step=400)
    e(16.0, ev.PsExited, shard=0, code=-9)
    e(16.5, ev.PsRestarted, shard=0)
    progress(17.0, 5, 4, 400)
    for s in range(4):
        e(20.0, ev.WorkerExited, host="localhost", slot=s, rank=s, code=0)
    e(20.1, ev.JobDone, round=5, size=4, resets=4, step=520)
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
    # The committed steps and the ps checkpoints' steps are two counts: never one series.
    assert [s for _, s in tl.steps] == [60, 120, 250, 400, 520] and not tl.rollbacks
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
        "1 ps restart, last step 520, last checkpoint step 400; job done after 20s"
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


def test_a_file_of_several_runs_is_split_where_each_driver_began(tmp_path):
    """A run is a driver's lines: from its job_started (a standby's from its first
    standing_by), or its job_failed when it failed before the job started; the lines
    after the job's end (the ps shards' final checkpoint) are still its own."""

    def line(x, kind, **fields):
        return {"t": 1000.0 + x, "elapsed": x, "kind": kind, **fields}

    first = [
        line(0.0, "job_started", job_id="a"),
        line(1.0, "round_formed", round=1, size=2),
        line(8.0, "job_done", round=1, size=2, resets=0),
        line(8.1, "checkpoint_written", step=300, final=True),
        line(8.2, "ps_exited", shard=0, code=0),
    ]
    # a driver that failed before the job started: no job_started, its elapsed from 0
    refused = [line(0.1, "job_failed", reason="discovery")]
    # a standby that waited, then led: one run
    standby = [
        line(0.0, "standing_by", job_id="b", leader="x"),
        line(5.0, "standing_by", job_id="b", leader="y"),
        line(9.0, "job_started", job_id="b"),
        line(9.1, "leading", term=3, how="adopted"),
        line(12.0, "job_failed", reason="reset limit"),
    ]
    # a driver killed before its end (no end line), then the next one
    killed = [line(0.0, "job_started", job_id="c"), line(30.0, "round_formed", round=1, size=1)]
    last = [
        line(0.0, "job_started", job_id="d"),
        line(0.1, "host_added", host="h", slots=3),
        line(1.0, "round_formed", round=1, size=3),
        line(2.0, "job_failed", reason="stopped by SIGTERM"),
    ]
    runs = split_runs(first + refused + standby + killed + last)
    assert runs == [first, refused, standby, killed, last]
    # (what a driver killed before its end leaves: the next one's first line tells)
    assert split_runs(killed + refused) == [killed, refused]
    path = tmp_path / "runs.jsonl"
    write_events(path, first + refused + standby + killed + last, torn=False)
    texts = svg_texts(plot(path, tmp_path / "runs.svg"))
    assert any("the last of 5 runs" in t for t in texts)
    assert any(t.startswith("1 round") and "failed: stopped by SIGTERM" in t for t in texts)


def ps_events() -> list[dict]:
    """A ps job whose workers commit no state: the only steps are the checkpoints'; a
    shard dies after the shards reached step 430 and restarts from the checkpoint of
    step 400."""

    def e(x, cls, **fields):
        return {"t": 1_700_000_000.0 + x, "elapsed": x, "kind": cls.kind, **fields}

    return [
        e(0.0, ev.JobStarted, job_id="j", store="s", np=2, min_np=2, max_np=2, command=[]),
        e(1.0, ev.RoundFormed, round=1, size=2, seconds=0.5),
        e(5.0, ev.CheckpointWritten, step=200, checkpoint=1),
        e(9.0, ev.CheckpointWritten, step=400, checkpoint=2),
        e(10.0, ev.PsExited, shard=1, code=-9),
        e(10.4, ev.PsRolledBack, shard=1, from_step=430, to_step=400, lost_steps=30),
        e(10.5, ev.PsRestarted, shard=1),
        e(14.0, ev.CheckpointWritten, step=600, checkpoint=3),
    ]


def test_ps_steps_are_labelled_as_checkpoint_steps_and_rollbacks_shown(tmp_path):
    tl = build_timeline(ps_events())
    assert tl.steps_are_checkpoints and tl.rollbacks == ((10.4, 400),)
    assert "last checkpoint step 600" in summary(tl)
    path = tmp_path / "ps.jsonl"
    write_events(path, ps_events(), torn=False)
    texts = svg_texts(plot(path, tmp_path / "ps.svg"))
    assert {"checkpoint step", "rollback", "back to 400"} <= set(texts)
    assert "committed step" not in texts


def test_a_committed_step_that_goes_back_is_a_rollback(tmp_path):
    """The state lost: training starts again from step 0. A snapshot of an older commit,
    written as training went on, is no going back; nor is a ps checkpoint's step, a
    count of its own, below the committed one."""

    def e(x, cls, **fields):
        return {"elapsed": x, "kind": cls.kind, **fields}

    def progress(x, step):
        return e(x, ev.Progress, round=1, size=2, step=step, steps_per_second=None)

    events = [
        progress(1.0, 100),
        e(1.5, ev.CheckpointWritten, step=36, checkpoint=1),
        e(2.0, ev.SnapshotWritten, step=90, round=1, path="/s", host="", seconds=0.1, bytes=1),
        progress(3.0, 200),
        e(4.0, ev.StateLost, round=3, previous=2, step=210),
        progress(5.0, 50),
    ]
    tl = build_timeline(events)
    assert [s for _, s in tl.steps] == [100, 100, 200, 210, 0, 50]
    assert tl.rollbacks == ((4.0, 0.0),)
    assert summary(tl).endswith(
        "last step 50, last checkpoint step 36, 1 rollback; no end recorded after 5.0s"
    )
    path = tmp_path / "lost.jsonl"
    write_events(path, events, torn=False)
    texts = svg_texts(plot(path, tmp_path / "lost.svg"))
    assert {"committed step", "rollback", "back to 0"} <= set(texts)


def test_the_worlds_of_restart_mode_are_its_rounds():
    def e(x, cls, **fields):
        return {"elapsed": x, "kind": cls.kind, **fields}

    def started(x, world, size):
        return e(x, ev.WorldStarted, world=world, restarts=world - 1, size=size, seconds=0.1)

    events = [
        started(1.0, 1, 4),
        e(5.0, ev.WorldStopping, world=1, reason="a host lost", failure=True),
        started(5.1, 2, 2),
        e(9.0, ev.JobDone, round=2, size=2, resets=1, world=True),
    ]
    tl = build_timeline(events)
    assert tl.world == ((1.0, 4), (5.1, 2)) and [r for _, r in tl.rounds] == [1, 2]
    assert summary(tl).startswith("2 rounds") and tl.outcome == "done"


@pytest.mark.system
@pytest.mark.timeout(120)
def test_the_picture_of_a_real_ps_job(tmp_path):
    """A real ps job (``--num-ps 1``) whose workers commit their place in the data: the
    shards' final checkpoint is said just before ``job_done`` (the shards stop before the
    job is said done) and the run ends with ``job_done``; the picture has its round, a
    committed step at each progress report and at the job's end, and the checkpoints'
    steps apart from them."""
    out = tmp_path / "out"
    out.mkdir()
    ckpt = tmp_path / "ckpt"
    args = ["-np", "2", "--num-ps", "1", "--ps-checkpoint-dir", str(ckpt)]
    args += ["--ps-checkpoint-interval", "0.3", "python", str(PS_LINEAR), str(out)]
    with ElasticRun([*args, "--steps", "300"], tmp_path) as run:
        assert run.wait(timeout=100) == 0, run.stderr_tail()
        events = run.events()
    kinds = [e["kind"] for e in events]
    final = [e for e in events if e["kind"] == "checkpoint_written" and e["final"]]
    assert kinds[-1] == "job_done" and len(final) == 1
    assert events.index(final[0]) < len(events) - 1  # the final checkpoint comes first
    done = events[-1]
    assert done["step"] > 0
    assert f"job done in round 1 at step {done['step']} (2 workers" in run.err_path.read_text()

    tl = build_timeline(events)
    told = [e["step"] for e in events if e["kind"] in ("progress", "job_done")]
    assert [s for _, s in tl.steps] == told and len(told) >= 2 and not tl.rollbacks
    checkpoints = [e["step"] for e in events if e["kind"] == "checkpoint_written"]
    assert [s for _, s in tl.checkpoints] == checkpoints and checkpoints[-1] >= 300
    assert summary(tl).startswith(
        f"1 round, last step {done['step']}, last checkpoint step {checkpoints[-1]}; job done after "
    )
    # Two runs appended to one file: each keeps its own tail, the picture is the last.
    twice = tmp_path / "twice.jsonl"
    twice.write_text(run.events_path.read_text() * 2)
    runs = split_runs(load_events(twice)[0])
    assert [len(r) for r in runs] == [len(events)] * 2
    done_cmd = run_plot(str(twice), "-o", str(tmp_path / "ps.svg"))
    assert done_cmd.returncode == 0, done_cmd.stderr
    texts = svg_texts(tmp_path / "ps.svg")
    assert "elastic-run: twice.jsonl (the last of 2 runs in the file)" in texts
    assert summary(tl) in texts and "no round formed" not in texts
    assert {"r1", "committed step", "checkpoint (ps step)", "step"} <= set(texts)


def test_version_and_usage_name_the_command():
    version = run_plot("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"elastic-plot {package_version()}"
    usage = run_plot()
    assert usage.returncode == 2 and usage.stderr.startswith("usage: elastic-plot ")


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


def test_snapshots_and_a_resume_are_marked_on_the_step_curve(tmp_path):
    path = tmp_path / "run.jsonl"
    events = [
        {"elapsed": 0.5, "kind": "round_formed", "round": 1, "size": 2},
        {"elapsed": 0.6, "kind": "snapshot_resumed", "step": 4663, "round": 1, "path": "/c"},
        {"elapsed": 2.0, "kind": "progress", "round": 1, "size": 2, "step": 5000},
        {"elapsed": 2.5, "kind": "snapshot_written", "step": 5100, "round": 1, "path": "/c"},
        {"elapsed": 3.0, "kind": "job_done", "round": 1, "size": 2, "resets": 0, "step": 5400},
    ]
    write_events(path, events, torn=False)
    tl = build_timeline(load_events(path)[0])
    assert tl.resumes == ((0.6, 4663.0),) and tl.snapshots == ((2.5, 5100.0),)
    texts = svg_texts(plot(path, tmp_path / "run.svg"))
    assert {"snapshot written", "resumed from a snapshot", "resumed at 4663"} <= set(texts)


def test_restart_mode_worlds_are_labelled_as_worlds_with_their_panel(tmp_path):
    path = tmp_path / "run.jsonl"
    world = {"restarts": 0, "hosts": ["h"], "members": ["a", "b"], "seconds": 0.0}
    events = [
        {"elapsed": 0.5, "kind": "world_started", "world": 1, "size": 2, **world},
        {"elapsed": 2.0, "kind": "world_started", "world": 2, "size": 1, **world},
        {"elapsed": 3.0, "kind": "job_done", "round": 2, "size": 1, "resets": 1, "world": True},
    ]
    write_events(path, events, torn=False)
    tl = build_timeline(load_events(path)[0])
    assert tl.worlds
    texts = svg_texts(plot(path, tmp_path / "run.svg"))
    assert {"w1", "w2", "world (restart mode)", "world size (per world)"} <= set(texts)
    assert "r1" not in texts
