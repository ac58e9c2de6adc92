"""Drawing a ``Timeline`` with matplotlib (the optional ``plot`` extra).

Two panels against seconds since the driver started: the world size of each round (a
step line with the round numbers), the live worker processes (dashed) and, above them,
a lane of markers (one shape and colour per event kind, stacked where they crowd); then,
when the log has steps, the newest committed step (a point at each event that tells
it), a ps job's checkpoints at their steps (the shards' own count, drawn as a line of
its own; the axis says "checkpoint step" when those are the only steps known), and the
rollbacks at the step training went back to. Every marker also gets a faint vertical
guide across both panels. SVG output keeps its text as text, so the picture is
searchable and small. matplotlib is used through ``Figure`` only (no pyplot), so
drawing a run never changes the caller's backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from driver import events as ev
from driver.errors import PlotError
from runplot.timeline import Timeline, marker_rows, summary

STYLE: dict[str, tuple[str, str, bool, str]] = {  # kind: (colour, marker, filled, legend)
    ev.WorkerFailed.kind: ("#d62728", "x", True, "worker failed"),
    ev.ChaosKill.kind: ("#ff7f0e", "*", True, "chaos kill"),
    ev.HostBlacklisted.kind: ("#7b3fa0", "s", True, "host blacklisted"),
    ev.HostAdded.kind: ("#2ca02c", "^", True, "host added"),
    ev.HostRemoved.kind: ("#7f7f7f", "v", True, "host removed"),
    ev.HostReturned.kind: ("#2ca02c", "o", False, "host back"),
    ev.PsExited.kind: ("#8c564b", "D", True, "ps shard exited"),
    ev.PsRestarted.kind: ("#8c564b", "D", False, "ps shard restarted"),
    ev.HostDiscoveryFailed.kind: ("#bcbd22", "P", True, "discovery error"),
    ev.JobDone.kind: ("#2ca02c", "|", True, "job done"),
    ev.JobFailure.kind: ("#d62728", "|", True, "job failed"),
}
WORLD_COLOUR = "#1f77b4"
LIVE_COLOUR = "#9ecae1"
STEP_COLOUR = "#2ca02c"
CHECKPOINT_COLOUR = "#8c564b"
ROLLBACK_COLOUR = "#d62728"
SNAPSHOT_COLOUR = "#9467bd"
LANE_POINTS = 880.0  # the plot's width in points, for spacing markers in the lane
LABEL_GAP = 22.0  # round labels closer than this many points are left out
_END_KINDS = (ev.JobDone.kind, ev.JobFailure.kind)


def _matplotlib() -> tuple[Any, Any]:
    """The ``matplotlib`` module and its ``Figure`` class, imported on first use: the
    renderer is an optional extra, and the rest of the package must load without it.

    Raises:
        PlotError: matplotlib is not installed (one line naming it).
    """
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(
            "matplotlib is not installed; install it to draw a run "
            "(pip install matplotlib, or the package's 'plot' extra)"
        ) from None
    return matplotlib, Figure


def render(tl: Timeline, path: Path, title: str) -> None:
    """Write the picture of ``tl`` to ``path`` (format from its suffix: svg, png, pdf).

    Raises:
        PlotError: matplotlib is not installed.
        OSError: the file cannot be written.
        ValueError: matplotlib does not know the suffix's format.
    """
    matplotlib, figure_class = _matplotlib()
    x_max = max([tl.duration, 1e-3] + [m.x for m in tl.markers])
    rows = marker_rows([m.x * LANE_POINTS / x_max for m in tl.markers])
    lanes = max(rows, default=0) + 1
    has_steps = bool(tl.steps or tl.checkpoints or tl.worlds)
    heights = [0.35 * lanes, 3.0] + ([2.6] if has_steps else [])
    fig = figure_class(figsize=(10, sum(heights) + 1.0))
    axes = fig.subplots(
        len(heights),
        1,
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": heights, "hspace": 0.08},
    )[:, 0]
    lane_ax, world_ax = axes[0], axes[1]
    _world(world_ax, tl, x_max)
    _markers(lane_ax, axes, tl, rows)
    if has_steps:
        _steps(axes[2], tl)
    axes[-1].set_xlabel("seconds since start")
    axes[-1].set_xlim(0, x_max * 1.02)
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if handles:
        axes[-1].legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.22),
            ncol=4,
            fontsize=8,
            frameon=False,
        )
    fig.suptitle(title, fontsize=12, fontweight="bold")
    lane_ax.set_title(summary(tl), fontsize=9)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "runplot"}):
        fig.savefig(path, bbox_inches="tight")


def _world(ax: Any, tl: Timeline, x_max: float) -> None:
    if tl.live:
        xs = [0.0] + [x for x, _ in tl.live] + [tl.duration]
        ys = [0] + [n for _, n in tl.live] + [tl.live[-1][1]]
        ax.step(
            xs, ys, where="post", color=LIVE_COLOUR, lw=1.5, ls="--", label="live worker processes"
        )
    if tl.world:
        xs = [0.0] + [x for x, _ in tl.world] + [tl.duration]
        ys = [0] + [s for _, s in tl.world] + [tl.world[-1][1]]
        unit = "world" if tl.worlds else "round"
        ax.step(xs, ys, where="post", color=WORLD_COLOUR, lw=2.4, label=f"world size (per {unit})")
        ax.plot([x for x, _ in tl.world], [s for _, s in tl.world], "o", color=WORLD_COLOUR, ms=4)
        last = -1e9
        for (x, size), (_, rnd) in zip(tl.world, tl.rounds):
            if (x - last) * LANE_POINTS / x_max > LABEL_GAP:  # skip labels that would overlap
                ax.annotate(
                    f"{'w' if tl.worlds else 'r'}{rnd}",
                    (x, size),
                    textcoords="offset points",
                    xytext=(3, 5),
                    fontsize=8,
                    color=WORLD_COLOUR,
                )
                last = x
    else:
        ax.text(
            0.5,
            0.5,
            "no round formed",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="#555555",
        )
    ax.set_ylabel("workers")
    ax.set_ylim(0, max([s for _, s in tl.world] + [n for _, n in tl.live] + [1]) * 1.15)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, color="#e6e6e6")


def _markers(lane: Any, axes: Any, tl: Timeline, rows: list[int]) -> None:
    """One symbol per marker in the lane (stacked in ``rows`` where they crowd), and a
    faint guide at its time across the panels below."""
    labelled: set[str] = set()
    for m, row in zip(tl.markers, rows):
        colour, shape, filled, text = STYLE[m.kind]
        for panel in axes[1:]:
            panel.axvline(
                m.x, color=colour, alpha=0.4, lw=1, ls="-" if m.kind in _END_KINDS else "--"
            )
        lane.plot(
            [m.x],
            [row],
            marker=shape,
            ls="none",
            ms=8,
            mew=2,
            color=colour,
            mfc=colour if filled else "white",
            label=None if m.kind in labelled else text,
        )
        labelled.add(m.kind)
    lane.set_ylim(-0.7, max(rows, default=0) + 0.7)
    lane.set_yticks([])
    for side in ("left", "right", "top"):
        lane.spines[side].set_visible(False)
    lane.tick_params(axis="x", length=0)


def _steps(ax: Any, tl: Timeline) -> None:
    if tl.worlds and not tl.steps:
        # Restart mode: the workers report no commit; each world runs the script anew,
        # so the panel shows which world ran when.
        xs = [x for x, _ in tl.rounds] + [tl.duration]
        ys = [float(n) for _, n in tl.rounds]
        ax.step(
            xs, [*ys, ys[-1]] if ys else [], where="post", color=STEP_COLOUR, lw=2, label="world"
        )
        ax.set_ylabel("world (restart mode)")
        ax.set_ylim(bottom=0)
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.grid(True, color="#e6e6e6")
        return
    if tl.steps:
        ax.plot(
            [x for x, _ in tl.steps],
            [s for _, s in tl.steps],
            color=STEP_COLOUR,
            lw=2,
            marker=".",  # a short run has few reports: each shows
            label="committed step",
        )
    if tl.checkpoints:
        ax.plot(
            [x for x, _ in tl.checkpoints],
            [s for _, s in tl.checkpoints],
            color=CHECKPOINT_COLOUR,
            lw=1.5,
            drawstyle="steps-post",
            marker="o",
            mfc="white",
            mew=1.8,
            label="checkpoint (ps step)",
        )
    _points(ax, tl.snapshots, "s", SNAPSHOT_COLOUR, "snapshot written", ms=6, mfc="white", mew=1.6)
    _points(ax, tl.resumes, "D", SNAPSHOT_COLOUR, "resumed from a snapshot", ms=7)
    _annotated(ax, tl.resumes, "resumed at {:g}", SNAPSHOT_COLOUR, (4, 6))
    _points(ax, tl.rollbacks, "v", ROLLBACK_COLOUR, "rollback", ms=8, mew=1.8)
    _annotated(ax, tl.rollbacks, "back to {:g}", ROLLBACK_COLOUR, (4, -12))
    if tl.steps and tl.checkpoints:
        ax.set_ylabel("step")
    else:
        ax.set_ylabel("committed step" if tl.steps else "checkpoint step")
    ax.set_ylim(bottom=0)
    ax.grid(True, color="#e6e6e6")


def _points(
    ax: Any, points: Sequence[tuple[float, float]], shape: str, colour: str, label: str, **style
) -> None:
    """``points`` as unjoined markers of ``shape`` (none: nothing drawn, no legend)."""
    if points:
        xs, ys = [x for x, _ in points], [y for _, y in points]
        ax.plot(xs, ys, shape, ls="none", color=colour, label=label, **style)


def _annotated(
    ax: Any, points: Sequence[tuple[float, float]], text: str, colour: str, offset: tuple
) -> None:
    """Each of ``points`` labelled with ``text`` formatted with its step."""
    for x, step in points:
        ax.annotate(
            text.format(step),
            (x, step),
            textcoords="offset points",
            xytext=offset,
            fontsize=8,
            color=colour,
        )
