"""What the picture of a run shows, computed from its events alone (pure).

* the world size of each round, with the round numbers, and the number of live worker
  processes when the log has worker start/exit events;
* the newest committed training step (rank 0's commits): a point at each event that
  tells it (``progress``, the workers' snapshots, ``state_lost``, the job's end);
* a ps job's checkpoint steps (the shards' global step, a count of its own: never
  mixed into the committed steps); a log whose only steps are those says so
  (``steps_are_checkpoints``);
* rollbacks: the committed step going back (state lost, a resume from an older
  snapshot), and ps shards restarted behind the step they had reached (``ps_rolled_back``);
* markers for what changed the world: worker failures, chaos kills, blacklisted, added,
  removed and returning hosts, ps shard exits and restarts, discovery errors, and the
  end of the job.

Torn or foreign lines in the events file are skipped and counted. A file that several
runs appended to (``--events`` appends) is split into runs where each driver began
(``split_runs``); the picture is of the last.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver import events as ev
from driver.errors import PlotError


@dataclass(frozen=True)
class Marker:
    x: float
    kind: str


@dataclass(frozen=True)
class Timeline:
    """The series of a run (seconds since the driver started on every x)."""

    duration: float
    world: tuple[tuple[float, int], ...]  # (elapsed, world size) at each round
    rounds: tuple[tuple[float, Any], ...]  # (elapsed, round number)
    live: tuple[tuple[float, int], ...]  # (elapsed, live worker processes)
    steps: tuple[tuple[float, float], ...]  # (elapsed, newest committed step)
    checkpoints: tuple[tuple[float, float], ...]  # (elapsed, a ps checkpoint's step)
    markers: tuple[Marker, ...]
    # (elapsed, the step training went back to): the committed step lower than the one
    # before, or ps shards restarted behind the step they had reached
    rollbacks: tuple[tuple[float, float], ...] = ()
    # (elapsed, step) of each snapshot written, and of each round that resumed from one
    snapshots: tuple[tuple[float, float], ...] = ()
    resumes: tuple[tuple[float, float], ...] = ()
    # restart mode (``world_started``): the world sizes are worlds', labelled "w<N>"
    worlds: bool = False
    outcome: str = ""  # "done", "failed: ...", or "" (no end event)
    counts: dict[str, int] = field(default_factory=dict, hash=False)

    @property
    def steps_are_checkpoints(self) -> bool:
        """The only steps known are checkpoints' (a ps job whose workers commit no
        state), so the step panel shows the checkpoints' steps."""
        return not self.steps and bool(self.checkpoints)


MARKER_KINDS = tuple(
    cls.kind
    for cls in (
        ev.WorkerFailed,
        ev.ChaosKill,
        ev.HostBlacklisted,
        ev.HostAdded,
        ev.HostRemoved,
        ev.HostReturned,
        ev.PsExited,
        ev.PsRestarted,
        ev.HostDiscoveryFailed,
        ev.JobDone,
        ev.JobFailure,
    )
)
_WORKER_ENDS = (ev.WorkerExited.kind, ev.WorkerFailed.kind, ev.WorkerStopped.kind)
# A new world size: a round formed, or a world of --restart-workers started.
_ROUND_KINDS = (ev.RoundFormed.kind, ev.WorldStarted.kind)
# The committed step (rank 0's commits) as it is at the event: the progress reports, the
# job's end, a round resuming from a snapshot.
_STEP_NOW = (ev.Progress.kind, ev.JobDone.kind, ev.SnapshotResumed.kind)
# A step committed at least: a snapshot's, written (or not) after its commit.
_STEP_AT_LEAST = (ev.SnapshotWritten.kind, ev.SnapshotFailed.kind, ev.JobStop.kind)


def load_events(path: str | Path) -> tuple[list[dict], int]:
    """The events of ``path`` in file order and the number of lines skipped (torn,
    not JSON, not an object with a ``kind``). Events without ``elapsed`` get it from
    ``t``.

    Raises:
        PlotError: the file cannot be read.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise PlotError(f"cannot read {path}: {exc.strerror or exc}") from exc
    events, skipped = [], 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            skipped += 1
            continue
        events.append(record)
    t0 = next((e["t"] for e in events if _number(e.get("t")) is not None), None)
    for e in events:
        if _number(e.get("elapsed")) is None:
            t = _number(e.get("t"))
            e["elapsed"] = t - t0 if t is not None and t0 is not None else None
    return events, skipped


#: how far ``elapsed`` may go back between two lines of one driver: its threads stamp
#: a line before they take turns writing it
SAME_DRIVER_SLACK = 1.0
# A driver's first line: a standby's wait, or the job's start (a standby's comes once it
# leads).
_FIRST_LINES = (ev.StandingBy.kind, ev.JobStarted.kind)
_END_LINES = (ev.JobDone.kind, ev.JobFailure.kind, ev.JobStop.kind, ev.LeadershipLostEvent.kind)


def split_runs(events: Sequence[dict]) -> list[list[dict]]:
    """The runs of an events file in file order: one per driver that appended to it.

    A driver's lines begin with its ``job_started`` (a standby's with its
    ``standing_by`` lines, then its ``job_started`` once it leads), or, for a driver
    that failed before the job started (a first discovery that failed), with its
    ``job_failed``: a second end in one run. Its ``elapsed`` counts from its own start,
    so a line whose ``elapsed`` goes back begins a run too (a driver killed before its
    end, then the next one). Everything else belongs to the run it follows, the lines
    after the job's end included: the ps shards' final checkpoint, the shards and
    workers stopping."""
    runs: list[list[dict]] = []
    waiting = ended = False  # the run so far: a standby's wait; its end said
    last = None
    for e in events:
        kind, elapsed = e.get("kind"), _number(e.get("elapsed"))
        begins = (
            not runs
            or (kind in _FIRST_LINES and not waiting)
            or (kind == ev.JobFailure.kind and ended)
            or (elapsed is not None and last is not None and elapsed < last - SAME_DRIVER_SLACK)
        )
        if begins:
            runs.append([])
            waiting = ended = False
        waiting = kind == ev.StandingBy.kind and (waiting or not runs[-1])
        ended = ended or kind in _END_LINES
        runs[-1].append(e)
        last = elapsed if elapsed is not None else last
    return runs


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def build_timeline(events: Iterable[dict]) -> Timeline:
    """The series and markers of a run (pure). Events without a usable ``elapsed`` are
    ignored; the rest are taken in time order."""
    usable = sorted(
        (e for e in events if _number(e.get("elapsed")) is not None), key=lambda e: e["elapsed"]
    )
    world: list[tuple[float, int]] = []
    rounds: list[tuple[float, Any]] = []
    live: list[tuple[float, int]] = []
    steps: list[tuple[float, float]] = []
    checkpoints: list[tuple[float, float]] = []
    rollbacks: list[tuple[float, float]] = []
    snapshots: list[tuple[float, float]] = []
    resumes: list[tuple[float, float]] = []
    markers: list[Marker] = []
    counts: dict[str, int] = {}
    running = 0
    outcome = ""
    saw_workers = False
    for e in usable:
        x, kind = float(e["elapsed"]), e["kind"]
        counts[kind] = counts.get(kind, 0) + 1
        if kind in _ROUND_KINDS and _number(e.get("size")) is not None:
            world.append((x, int(e["size"])))
            # (a world of --restart-workers is its job's round)
            rounds.append((x, e.get("round", e.get("world", len(rounds) + 1))))
        elif kind == ev.WorkerStarted.kind:
            saw_workers = True
            running += 1
            live.append((x, running))
        elif kind in _WORKER_ENDS and saw_workers:
            running = max(0, running - 1)
            live.append((x, running))
        step = _number(e.get("step"))
        newest = steps[-1][1] if steps else None
        if kind == ev.SnapshotWritten.kind and step is not None:
            snapshots.append((x, step))
        elif kind == ev.SnapshotResumed.kind and step is not None:
            resumes.append((x, step))
        if kind in _STEP_NOW and step is not None:
            if newest is not None and step < newest:
                rollbacks.append((x, step))
            steps.append((x, step))
        elif kind in _STEP_AT_LEAST and step is not None:
            # A snapshot is of a commit made a moment ago: training may be past it.
            steps.append((x, step if newest is None else max(newest, step)))
        elif kind == ev.StateLost.kind:
            if step is not None and (newest is None or step > newest):
                steps.append((x, step))
            steps.append((x, 0.0))  # training starts again from the script's first state
            rollbacks.append((x, 0.0))
        elif kind == ev.CheckpointWritten.kind and step is not None:
            checkpoints.append((x, step))
        elif kind == ev.PsRolledBack.kind and _number(e.get("to_step")) is not None:
            rollbacks.append((x, float(e["to_step"])))
        if kind in MARKER_KINDS:
            markers.append(Marker(x, kind))
        if kind == ev.JobDone.kind:
            outcome = "done"
        elif kind == ev.JobFailure.kind:
            outcome = f"failed: {e.get('reason', '?')}"
    duration = usable[-1]["elapsed"] if usable else 0.0
    return Timeline(
        duration=float(duration),
        world=tuple(world),
        rounds=tuple(rounds),
        live=tuple(live),
        steps=tuple(steps),
        checkpoints=tuple(checkpoints),
        markers=tuple(markers),
        rollbacks=tuple(rollbacks),
        snapshots=tuple(snapshots),
        resumes=tuple(resumes),
        worlds=counts.get(ev.WorldStarted.kind, 0) > 0,
        outcome=outcome,
        counts=counts,
    )


def summary(tl: Timeline) -> str:
    """One line about the run, e.g. ``4 rounds, 2 worker failures, 1 chaos kill; job
    done after 63s``."""
    c = tl.counts
    parts = [f"{len(tl.rounds)} round" + ("" if len(tl.rounds) == 1 else "s")]
    for kind, word in (
        (ev.WorkerFailed.kind, "worker failure"),
        (ev.ChaosKill.kind, "chaos kill"),
        (ev.HostBlacklisted.kind, "blacklisting"),
        (ev.PsRestarted.kind, "ps restart"),
    ):
        if c.get(kind):
            parts.append(f"{c[kind]} {word}" + ("" if c[kind] == 1 else "s"))
    if tl.steps:
        parts.append(f"last step {_fmt_number(tl.steps[-1][1])}")
    if tl.checkpoints:
        parts.append(f"last checkpoint step {_fmt_number(tl.checkpoints[-1][1])}")
    if tl.rollbacks:
        parts.append(f"{len(tl.rollbacks)} rollback" + ("" if len(tl.rollbacks) == 1 else "s"))
    end = f"job {tl.outcome}" if tl.outcome else "no end recorded"
    return f"{', '.join(parts)}; {end} after {_fmt_seconds(tl.duration)}"


def _fmt_number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _fmt_seconds(s: float) -> str:
    if s < 120:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def marker_rows(xs: Sequence[float], min_gap: float = 13.0, max_rows: int = 4) -> list[int]:
    """A lane row for each marker at ``xs`` (in time order, in points across the plot)
    so that markers closer than ``min_gap`` stack instead of hiding each other (at most
    ``max_rows``; past that, the row free for longest is reused)."""
    last: list[float] = []
    rows = []
    for x in xs:
        row = next((i for i, lx in enumerate(last) if x - lx >= min_gap), None)
        if row is None:
            if len(last) < max_rows:
                row = len(last)
                last.append(x)
            else:
                row = min(range(len(last)), key=lambda i: last[i])
        last[row] = x
        rows.append(row)
    return rows
