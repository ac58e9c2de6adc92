"""A picture of a run from its events file: ``python -m driver.plot EVENTS.jsonl -o run.svg``.

Draws, against seconds since the driver started:

* the world size of each round (a step line, with the round numbers), and the number
  of live worker processes when the log has worker start/exit events;
* the newest committed training step, when events carry a ``step`` field;
* markers for what changed the world: worker failures, chaos kills, blacklisted,
  added, removed and returning hosts, ps shard exits and restarts, discovery errors,
  and the end of the job (hover a marker in a browser for its details).

The SVG is written by hand (``render_svg``: no dependency, self-contained, readable in
any browser); ``-o run.png`` uses matplotlib when it is installed and otherwise writes
the SVG next to it. Torn or foreign lines in the events file are skipped and counted.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence
from xml.sax.saxutils import escape, quoteattr

from rendezvous.errors import ElasticError

from driver import events as ev


class PlotError(ElasticError):
    """The events file cannot be read or holds no usable event."""


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Marker:
    x: float
    kind: str
    text: str


@dataclass(frozen=True)
class Timeline:
    """What the picture shows, computed from the events alone (pure)."""
    duration: float
    world: tuple[tuple[float, int], ...]        # (elapsed, world size) at each round
    rounds: tuple[tuple[float, Any], ...]       # (elapsed, round number)
    live: tuple[tuple[float, int], ...]         # (elapsed, live worker processes)
    steps: tuple[tuple[float, float], ...]      # (elapsed, newest committed step)
    checkpoints: tuple[tuple[float, float], ...]
    markers: tuple[Marker, ...]
    outcome: str                                # "done", "failed: ...", or "" (no end event)
    counts: dict = field(default_factory=dict, hash=False)


MARKER_KINDS = (ev.WORKER_FAILED, ev.CHAOS_KILL, ev.HOST_BLACKLISTED, ev.HOST_ADDED,
                ev.HOST_REMOVED, ev.HOST_BACK, ev.PS_EXITED, ev.PS_RESTARTED,
                ev.DISCOVERY_ERROR, ev.JOB_DONE, ev.JOB_FAILED)

STYLE = {  # kind: (colour, shape, legend text)
    ev.WORKER_FAILED: ("#d62728", "x", "worker failed"),
    ev.CHAOS_KILL: ("#ff7f0e", "bolt", "chaos kill"),
    ev.HOST_BLACKLISTED: ("#7b3fa0", "square", "host blacklisted"),
    ev.HOST_ADDED: ("#2ca02c", "up", "host added"),
    ev.HOST_REMOVED: ("#7f7f7f", "down", "host removed"),
    ev.HOST_BACK: ("#2ca02c", "circle", "host back"),
    ev.PS_EXITED: ("#8c564b", "diamond", "ps shard exited"),
    ev.PS_RESTARTED: ("#8c564b", "diamond-open", "ps shard restarted"),
    ev.DISCOVERY_ERROR: ("#bcbd22", "circle", "discovery error"),
    ev.JOB_DONE: ("#2ca02c", "bar", "job done"),
    ev.JOB_FAILED: ("#d62728", "bar", "job failed"),
}
WORLD_COLOUR = "#1f77b4"
LIVE_COLOUR = "#9ecae1"
STEP_COLOUR = "#2ca02c"


def load_events(path: str | Path) -> tuple[list[dict], int]:
    """The events of ``path`` in file order and the number of lines skipped (torn,
    not JSON, not an object with a ``kind``). Events without ``elapsed`` get it from
    ``t``. Raises ``PlotError`` if the file cannot be read."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise PlotError(f"cannot read {path}: {e.strerror or e}") from e
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


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _marker_text(e: dict) -> str:
    fields = {k: v for k, v in e.items() if k not in ("t", "elapsed", "kind")}
    return f"{e['elapsed']:.2f}s  {ev.format_event(e['kind'], fields)}"


def build_timeline(events: Iterable[dict]) -> Timeline:
    """The series and markers of a run (pure). Events without a usable ``elapsed`` are
    ignored; the rest are taken in time order."""
    usable = sorted((e for e in events if _number(e.get("elapsed")) is not None),
                    key=lambda e: e["elapsed"])
    world, rounds, live, steps, checkpoints, markers = [], [], [], [], [], []
    counts: dict[str, int] = {}
    running = 0
    outcome = ""
    saw_workers = False
    for e in usable:
        x, kind = float(e["elapsed"]), e["kind"]
        counts[kind] = counts.get(kind, 0) + 1
        if kind == ev.ROUND_FORMED and _number(e.get("size")) is not None:
            world.append((x, int(e["size"])))
            rounds.append((x, e.get("round", len(rounds) + 1)))
        elif kind == ev.WORKER_STARTED:
            saw_workers = True
            running += 1
            live.append((x, running))
        elif kind in (ev.WORKER_EXITED, ev.WORKER_FAILED, ev.WORKER_STOPPED) and saw_workers:
            running = max(0, running - 1)
            live.append((x, running))
        step = _number(e.get("step"))
        if step is not None and kind != ev.PS_RESTARTED:
            # A restart reports the checkpoint it went back to, not progress.
            steps.append((x, step))
            if kind == ev.CHECKPOINT_WRITTEN:
                checkpoints.append((x, step))
        if kind in MARKER_KINDS:
            markers.append(Marker(x, kind, _marker_text(e)))
        if kind == ev.JOB_DONE:
            outcome = "done"
        elif kind == ev.JOB_FAILED:
            outcome = f"failed: {e.get('reason', '?')}"
    duration = usable[-1]["elapsed"] if usable else 0.0
    return Timeline(duration=float(duration), world=tuple(world), rounds=tuple(rounds),
                    live=tuple(live), steps=tuple(steps), checkpoints=tuple(checkpoints),
                    markers=tuple(markers), outcome=outcome, counts=counts)


def summary(tl: Timeline) -> str:
    """One line about the run, e.g. ``4 rounds, 2 workers failed, 1 chaos kill; job done
    after 63s``."""
    c = tl.counts
    parts = [f"{len(tl.rounds)} round" + ("" if len(tl.rounds) == 1 else "s")]
    for kind, word in ((ev.WORKER_FAILED, "worker failure"), (ev.CHAOS_KILL, "chaos kill"),
                       (ev.HOST_BLACKLISTED, "blacklisting"), (ev.PS_RESTARTED, "ps restart")):
        if c.get(kind):
            parts.append(f"{c[kind]} {word}" + ("" if c[kind] == 1 else "s"))
    if tl.steps:
        parts.append(f"last step {_fmt_number(tl.steps[-1][1])}")
    end = f"job {tl.outcome}" if tl.outcome else "no end recorded"
    return f"{', '.join(parts)}; {end} after {_fmt_seconds(tl.duration)}"


def _fmt_number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _fmt_seconds(s: float) -> str:
    if s < 120:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def nice_ticks(lo: float, hi: float, target: int = 6, integer: bool = False,
               cover: bool = False) -> list[float]:
    """Round-numbered ticks within ``[lo, hi]`` (about ``target`` of them); with
    ``cover``, one more past ``hi`` if needed so that the last tick is >= ``hi``."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1, math.ceil(step))
    first = math.floor(lo / step) * step
    ticks, v = [], first
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            ticks.append(round(v, 10))
        v += step
    if cover and ticks[-1] < hi:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


# ----------------------------------------------------------------------------- svg


def marker_rows(xs: Sequence[float], min_gap: float = 13.0, max_rows: int = 4) -> list[int]:
    """A lane row for each marker at pixel ``xs`` (in time order) so that markers closer
    than ``min_gap`` pixels stack instead of hiding each other (at most ``max_rows``)."""
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


class _Axes:
    """Maps data to pixels inside one panel."""

    def __init__(self, left, top, width, height, x_max, y_max):
        self.left, self.top, self.width, self.height = left, top, width, height
        self.x_max, self.y_max = max(x_max, 1e-9), max(y_max, 1e-9)

    def x(self, v: float) -> float:
        return self.left + self.width * v / self.x_max

    def y(self, v: float) -> float:
        return self.top + self.height * (1 - v / self.y_max)


def _step_path(points: Sequence[tuple[float, float]], ax: _Axes, x_end: float,
               start: Optional[float] = None) -> str:
    """A step line: each value holds until the next point (and until ``x_end``)."""
    if not points:
        return ""
    d = []
    if start is not None:
        d.append(f"M{ax.x(0):.1f},{ax.y(start):.1f} H{ax.x(points[0][0]):.1f}")
        d.append(f"V{ax.y(points[0][1]):.1f}")
    else:
        d.append(f"M{ax.x(points[0][0]):.1f},{ax.y(points[0][1]):.1f}")
    for (x, y) in points[1:]:
        d.append(f"H{ax.x(x):.1f} V{ax.y(y):.1f}")
    d.append(f"H{ax.x(x_end):.1f}")
    return " ".join(d)


def _shape(shape: str, cx: float, cy: float, colour: str, r: float = 5.5) -> str:
    c = quoteattr(colour)
    if shape == "x":
        return (f'<path d="M{cx-r},{cy-r} L{cx+r},{cy+r} M{cx-r},{cy+r} L{cx+r},{cy-r}" '
                f'stroke={c} stroke-width="2.5" fill="none"/>')
    if shape == "bolt":
        return (f'<path d="M{cx+1},{cy-r-1} L{cx-3.5},{cy+0.5} L{cx},{cy+0.5} L{cx-1},{cy+r+1} '
                f'L{cx+3.5},{cy-0.5} L{cx},{cy-0.5} Z" fill={c} stroke={c} stroke-width="0.8"/>')
    if shape == "square":
        return f'<rect x="{cx-r+1}" y="{cy-r+1}" width="{2*r-2}" height="{2*r-2}" fill={c}/>'
    if shape == "up":
        return f'<path d="M{cx},{cy-r} L{cx+r},{cy+r-1} L{cx-r},{cy+r-1} Z" fill={c}/>'
    if shape == "down":
        return f'<path d="M{cx},{cy+r} L{cx+r},{cy-r+1} L{cx-r},{cy-r+1} Z" fill={c}/>'
    if shape in ("diamond", "diamond-open"):
        fill = c if shape == "diamond" else '"white"'
        return (f'<path d="M{cx},{cy-r} L{cx+r},{cy} L{cx},{cy+r} L{cx-r},{cy} Z" fill={fill} '
                f'stroke={c} stroke-width="1.8"/>')
    if shape == "bar":
        return f'<rect x="{cx-2}" y="{cy-r-1}" width="4" height="{2*r+2}" fill={c}/>'
    return f'<circle cx="{cx}" cy="{cy}" r="{r-1}" fill="white" stroke={c} stroke-width="2"/>'


def _x_axis(out: list, ax: _Axes, ticks: list[float], labels: bool) -> None:
    for t in ticks:
        px = ax.x(t)
        out.append(f'<line x1="{px:.1f}" y1="{ax.top}" x2="{px:.1f}" y2="{ax.top+ax.height}" '
                   f'class="grid"/>')
        if labels:
            out.append(f'<text x="{px:.1f}" y="{ax.top+ax.height+16}" class="tick" '
                       f'text-anchor="middle">{_fmt_number(t)}</text>')


def _y_axis(out: list, ax: _Axes, ticks: list[float], title: str) -> None:
    for t in ticks:
        py = ax.y(t)
        out.append(f'<line x1="{ax.left}" y1="{py:.1f}" x2="{ax.left+ax.width}" y2="{py:.1f}" '
                   f'class="grid"/>')
        out.append(f'<text x="{ax.left-8}" y="{py+4:.1f}" class="tick" '
                   f'text-anchor="end">{_fmt_number(t)}</text>')
    cy = ax.top + ax.height / 2
    out.append(f'<text x="{ax.left-46}" y="{cy:.1f}" class="label" text-anchor="middle" '
               f'transform="rotate(-90 {ax.left-46} {cy:.1f})">{escape(title)}</text>')
    out.append(f'<rect x="{ax.left}" y="{ax.top}" width="{ax.width}" height="{ax.height}" '
               f'class="frame"/>')


def render_svg(tl: Timeline, title: str = "elastic-run") -> str:
    """The picture as a self-contained SVG document (pure)."""
    width, left, right = 980, 78, 24
    plot_w = width - left - right
    has_steps = bool(tl.steps)
    top = 64
    x_max = max(tl.duration, max((m.x for m in tl.markers), default=0.0), 1e-3)
    x_ticks = nice_ticks(0, x_max)
    x_max = max(x_max, x_ticks[-1])
    rows = marker_rows([plot_w * m.x / x_max for m in tl.markers])
    lane_rows = max(rows, default=0) + 1
    lane_h = 12 + 14 * lane_rows     # marker lane above the world-size panel
    world_h = 210
    steps_h = 170 if has_steps else 0
    gap = 30 if has_steps else 0
    legend_h = 58
    height = top + lane_h + world_h + gap + steps_h + 34 + legend_h

    sizes = [s for _, s in tl.world] + [n for _, n in tl.live]
    y_max = max(sizes, default=1)
    w_ticks = nice_ticks(0, max(1, y_max), target=min(6, max(1, y_max)), integer=True,
                         cover=True)
    world_ax = _Axes(left, top + lane_h, plot_w, world_h, x_max, w_ticks[-1] * 1.08)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Helvetica, Arial, '
           f'sans-serif">',
           "<style>"
           ".grid{stroke:#e6e6e6;stroke-width:1}"
           ".frame{fill:none;stroke:#999;stroke-width:1}"
           ".tick{font-size:11px;fill:#555}"
           ".label{font-size:12px;fill:#333}"
           ".title{font-size:17px;font-weight:bold;fill:#222}"
           ".sub{font-size:12px;fill:#555}"
           ".round{font-size:10px;fill:#1f77b4}"
           ".legend{font-size:11.5px;fill:#333}"
           ".marker:hover{opacity:0.6}"
           "</style>",
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="26" class="title">{escape(title)}</text>',
           f'<text x="{left}" y="46" class="sub">{escape(summary(tl))}</text>']

    # Vertical guides for every marker, across all panels, drawn first (underneath).
    bottom = world_ax.top + world_h + gap + steps_h
    for m in tl.markers:
        colour = STYLE[m.kind][0]
        px = world_ax.x(m.x)
        dash = "" if m.kind in (ev.JOB_DONE, ev.JOB_FAILED) else ' stroke-dasharray="3,3"'
        out.append(f'<line x1="{px:.1f}" y1="{top + lane_h:.1f}" x2="{px:.1f}" y2="{bottom:.1f}" '
                   f'stroke={quoteattr(colour)} stroke-opacity="0.45"{dash}/>')

    # World size panel.
    _x_axis(out, world_ax, x_ticks, labels=not has_steps)
    _y_axis(out, world_ax, w_ticks, "workers")
    if tl.live:
        out.append(f'<path d="{_step_path(tl.live, world_ax, x_max, start=0)}" fill="none" '
                   f'stroke="{LIVE_COLOUR}" stroke-width="1.6" stroke-dasharray="5,3"/>')
    if tl.world:
        path = _step_path(tl.world, world_ax, tl.duration, start=0)
        out.append(f'<path d="{path}" fill="none" stroke="{WORLD_COLOUR}" stroke-width="2.6" '
                   f'stroke-linejoin="round"/>')
        last_label_px = -1e9
        for (x, size), (_, rnd) in zip(tl.world, tl.rounds):
            px, py = world_ax.x(x), world_ax.y(size)
            out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.2" fill="{WORLD_COLOUR}">'
                       f'<title>{escape(f"round {rnd}: {size} workers at {x:.2f}s")}</title>'
                       f'</circle>')
            if px - last_label_px > 22:  # skip labels that would overlap
                out.append(f'<text x="{px+3:.1f}" y="{py-6:.1f}" class="round">r{escape(str(rnd))}'
                           f'</text>')
                last_label_px = px
    else:
        out.append(f'<text x="{left + plot_w/2}" y="{world_ax.top + world_h/2}" class="sub" '
                   f'text-anchor="middle">no round formed</text>')

    # Marker lane: one symbol per marker, with its details as a tooltip.
    for m, row in zip(tl.markers, rows):
        colour, shape, _ = STYLE[m.kind]
        lane_y = top + lane_h - 12 - 14 * row
        out.append(f'<g class="marker"><title>{escape(m.text)}</title>'
                   f'{_shape(shape, round(world_ax.x(m.x), 1), lane_y, colour)}</g>')

    # Steps panel.
    if has_steps:
        s_max = max(s for _, s in tl.steps)
        s_ticks = nice_ticks(0, max(1.0, s_max), integer=True, cover=True)
        steps_ax = _Axes(left, world_ax.top + world_h + gap, plot_w, steps_h, x_max,
                         s_ticks[-1] * 1.05)
        _x_axis(out, steps_ax, x_ticks, labels=True)
        _y_axis(out, steps_ax, s_ticks, "committed step")
        pts = " ".join(f"{steps_ax.x(x):.1f},{steps_ax.y(s):.1f}" for x, s in tl.steps)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{STEP_COLOUR}" '
                   f'stroke-width="2.2" stroke-linejoin="round"/>')
        for x, s in tl.checkpoints:
            out.append(f'<circle cx="{steps_ax.x(x):.1f}" cy="{steps_ax.y(s):.1f}" r="3.5" '
                       f'fill="white" stroke="{STEP_COLOUR}" stroke-width="1.8">'
                       f'<title>{escape(f"checkpoint of step {_fmt_number(s)} at {x:.2f}s")}'
                       f'</title></circle>')
    axis_bottom = world_ax.top + world_h + gap + steps_h
    out.append(f'<text x="{left + plot_w/2}" y="{axis_bottom + 32}" class="label" '
               f'text-anchor="middle">seconds since start</text>')

    # Legend: the lines, then only the marker kinds that occur.
    items = [("line", WORLD_COLOUR, "world size (per round)", "")]
    if tl.live:
        items.append(("line", LIVE_COLOUR, "live worker processes", "5,3"))
    if has_steps:
        items.append(("line", STEP_COLOUR, "committed step", ""))
    seen = []
    for m in tl.markers:
        if m.kind not in seen:
            seen.append(m.kind)
    items += [("marker", m, STYLE[m][2], "") for m in seen]
    lx, ly = left, axis_bottom + 58
    for kind, what, text, dash in items:
        item_w = 30 + 7 * len(text)
        if lx + item_w > width - right:
            lx, ly = left, ly + 20
        if kind == "line":
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<line x1="{lx}" y1="{ly-4}" x2="{lx+20}" y2="{ly-4}" stroke="{what}" '
                       f'stroke-width="2.5"{dash_attr}/>')
        else:
            colour, shape, _ = STYLE[what]
            out.append(_shape(shape, lx + 10, ly - 4, colour, r=5))
        out.append(f'<text x="{lx+26}" y="{ly}" class="legend">{escape(text)}</text>')
        lx += item_w + 14
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- matplotlib


def render_matplotlib(tl: Timeline, path: Path, title: str) -> None:
    """The same picture through matplotlib (PNG, PDF, ...). Raises ImportError when
    matplotlib is not installed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = 2 if tl.steps else 1
    fig, axes = plt.subplots(rows, 1, sharex=True, figsize=(10, 3.2 * rows + 0.8),
                             squeeze=False)
    ax = axes[0][0]
    if tl.world:
        xs = [0.0] + [x for x, _ in tl.world] + [tl.duration]
        ys = [0] + [s for _, s in tl.world] + [tl.world[-1][1]]
        ax.step(xs, ys, where="post", color=WORLD_COLOUR, lw=2.4, label="world size")
    if tl.live:
        xs = [0.0] + [x for x, _ in tl.live] + [tl.duration]
        ys = [0] + [n for _, n in tl.live] + [tl.live[-1][1]]
        ax.step(xs, ys, where="post", color=LIVE_COLOUR, lw=1.5, ls="--",
                label="live worker processes")
    ax.set_ylabel("workers")
    shapes = {"x": "x", "bolt": "v", "square": "s", "up": "^", "down": "v", "circle": "o",
              "diamond": "D", "diamond-open": "D", "bar": "|"}
    top = max([s for _, s in tl.world] + [n for _, n in tl.live] + [1]) * 1.12
    labelled = set()
    for m in tl.markers:
        colour, shape, text = STYLE[m.kind]
        for row in axes:
            row[0].axvline(m.x, color=colour, alpha=0.35, ls="--", lw=1)
        ax.plot([m.x], [top], marker=shapes[shape], color=colour, ls="none",
                label=None if m.kind in labelled else text)
        labelled.add(m.kind)
    ax.set_ylim(0, top * 1.08)
    if tl.steps:
        sax = axes[1][0]
        sax.plot([x for x, _ in tl.steps], [s for _, s in tl.steps], color=STEP_COLOUR, lw=2,
                 label="committed step")
        sax.set_ylabel("committed step")
        sax.legend(loc="upper left", fontsize=8)
    axes[-1][0].set_xlabel("seconds since start")
    ax.legend(loc="lower right", fontsize=8, ncol=3)
    fig.suptitle(f"{title}\n{summary(tl)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ----------------------------------------------------------------------------- command


def plot(events_path: str | Path, output: Optional[str | Path] = None,
         title: Optional[str] = None) -> Path:
    """Write the picture of ``events_path`` and return the file written: ``output``
    (default: the events path with ``.svg``), or the SVG next to it when ``output`` is
    not ``.svg`` and matplotlib is missing. Raises ``PlotError`` for an unreadable file
    or one without events, ``OSError`` if the output cannot be written."""
    events, _ = load_events(events_path)
    if not events:
        raise PlotError(f"{events_path}: no events")
    tl = build_timeline(events)
    title = title or f"elastic-run: {Path(events_path).name}"
    out = Path(output) if output is not None else Path(events_path).with_suffix(".svg")
    if out.suffix.lower() != ".svg":
        try:
            render_matplotlib(tl, out, title)
            return out
        except ImportError:
            out = out.with_suffix(".svg")
    out.write_text(render_svg(tl, title), encoding="utf-8")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m driver.plot",
        description="Draw a run (world size, committed steps, failures) from an "
                    "elastic-run --events file.")
    parser.add_argument("events", help="the JSON-lines events file")
    parser.add_argument("-o", "--output", help="picture to write: .svg (always available) "
                        "or .png/.pdf (with matplotlib; otherwise the .svg is written "
                        "instead) (default: EVENTS with .svg)")
    parser.add_argument("--title", help="title above the picture")
    args = parser.parse_args(argv)
    try:
        written = plot(args.events, args.output, args.title)
    except (PlotError, OSError) as e:
        print(f"plot: {e}", file=sys.stderr)
        return 1
    if args.output and Path(args.output) != written:
        print(f"plot: matplotlib is not installed; wrote {written} instead", file=sys.stderr)
    else:
        print(f"plot: wrote {written}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
