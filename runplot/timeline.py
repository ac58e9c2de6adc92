"""What the picture of a run shows, computed from its events alone (pure).

* the world size of each round, with the round numbers, and the number of live worker
  processes when the log has worker start/exit events;
* the newest committed training step, when events carry a ``step`` field (``progress``
  and checkpoint events always do), and the checkpoints themselves; a log whose steps
  all come from checkpoints (a ps job) says so (``steps_are_checkpoints``);
* ps shard restarts from a checkpoint (the step they went back to), and rollbacks:
  a restart to a step below the newest one known, or a step lower than the one before;
* markers for what changed the world: worker failures, chaos kills, blacklisted, added,
  removed and returning hosts, ps shard exits and restarts, discovery errors, and the
  end of the job.

Torn or foreign lines in the events file are skipped and counted. A file that several
runs appended to (``--events`` appends) is split into runs (``split_runs``); the picture
is of the last.
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
    checkpoints: tuple[tuple[float, float], ...]
    markers: tuple[Marker, ...]
    # (elapsed, the checkpoint's step) of each ps shard restarted from a checkpoint
    restarts: tuple[tuple[float, float], ...] = ()
    # (elapsed, the step training went back to): a restart below the newest step known,
    # or a step lower than the one before
    rollbacks: tuple[tuple[float, float], ...] = ()
    outcome: str = ""  # "done", "failed: ...", or "" (no end event)
    counts: dict[str, int] = field(default_factory=dict, hash=False)

    @property
    def steps_are_checkpoints(self) -> bool:
        """Every step known comes from a checkpoint (a ps job: its shards report steps,
        its workers none), so the step line is the checkpoints' steps."""
        return bool(self.steps) and len(self.steps) == len(self.checkpoints)


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


def split_runs(events: Sequence[dict]) -> list[list[dict]]:
    """The runs of an events file in file order. A run begins at a ``job_started`` line,
    or at the first line after a run's end (``job_done``, ``job_failed``): a run that
    failed before it started (a discovery error) has no ``job_started`` line."""
    runs: list[list[dict]] = []
    ended = True
    for e in events:
        kind = e.get("kind")
        if kind == ev.JobStarted.kind or ended:
            if not (runs and not runs[-1]):
                runs.append([])
            ended = False
        runs[-1].append(e)
        if kind in (ev.JobDone.kind, ev.JobFailure.kind):
            ended = True
    return [run for run in runs if run]


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
    restarts: list[tuple[float, float]] = []
    rollbacks: list[tuple[float, float]] = []
    markers: list[Marker] = []
    counts: dict[str, int] = {}
    running = 0
    outcome = ""
    saw_workers = False
    for e in usable:
        x, kind = float(e["elapsed"]), e["kind"]
        counts[kind] = counts.get(kind, 0) + 1
        if kind == ev.RoundFormed.kind and _number(e.get("size")) is not None:
            world.append((x, int(e["size"])))
            rounds.append((x, e.get("round", len(rounds) + 1)))
        elif kind == ev.WorkerStarted.kind:
            saw_workers = True
            running += 1
            live.append((x, running))
        elif kind in _WORKER_ENDS and saw_workers:
            running = max(0, running - 1)
            live.append((x, running))
        step = _number(e.get("step"))
        if step is not None and kind == ev.PsRestarted.kind:
            # A restart reports the checkpoint it went back to, not progress.
            restarts.append((x, step))
            if steps and step < steps[-1][1]:
                rollbacks.append((x, step))
        elif step is not None:
            if steps and step < steps[-1][1]:
                rollbacks.append((x, step))
            steps.append((x, step))
            if kind == ev.CheckpointWritten.kind:
                checkpoints.append((x, step))
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
        restarts=tuple(restarts),
        rollbacks=tuple(rollbacks),
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
        what = "last checkpoint step" if tl.steps_are_checkpoints else "last step"
        parts.append(f"{what} {_fmt_number(tl.steps[-1][1])}")
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
