"""``elastic-plot EVENTS.jsonl [-o run.svg] [--title T]`` (or ``python -m runplot``):
draw a run. ``--version`` prints the version (``elastic-run``'s: one package).

Exit status 0 when the picture was written; 1 with a one-line reason when the events
file cannot be read or holds no event, the picture cannot be written, or matplotlib is
not installed (then no file is written).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from driver.errors import PlotError
from rendezvous.version import package_version
from runplot.render import render
from runplot.timeline import build_timeline, load_events, split_runs

# The installed command's name, also under ``python -m runplot``: the one users type.
PROG = "elastic-plot"


def plot(
    events_path: str | Path, output: str | Path | None = None, title: str | None = None
) -> Path:
    """Write the picture of ``events_path`` to ``output`` (default: the events path with
    ``.svg``) and return the path written. A file that several runs appended to is
    drawn for its last run.

    Raises:
        PlotError: the file cannot be read, holds no events, or matplotlib is missing.
        OSError: the picture cannot be written.
        ValueError: matplotlib does not know the output's format.
    """
    events, _ = load_events(events_path)
    if not events:
        raise PlotError(f"{events_path}: no events")
    runs = split_runs(events)
    if title is None:
        title = f"elastic-run: {Path(events_path).name}"
        if len(runs) > 1:
            title += f" (the last of {len(runs)} runs in the file)"
    out = Path(output) if output is not None else Path(events_path).with_suffix(".svg")
    render(build_timeline(runs[-1]), out, title)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Draw a run (world size, committed steps, failures) from an "
        "elastic-run --events file (needs matplotlib); of a file several runs "
        "appended to, the last run.",
    )
    parser.add_argument("events", help="the JSON-lines events file")
    parser.add_argument(
        "-o",
        "--output",
        help="picture to write; the format follows the "
        "suffix: .svg, .png, .pdf, ... (default: EVENTS with .svg)",
    )
    parser.add_argument("--title", help="title above the picture")
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {package_version()}",
        help="print the version and exit",
    )
    args = parser.parse_args(argv)
    try:
        written = plot(args.events, args.output, args.title)
    except (PlotError, OSError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    print(f"{PROG}: wrote {written}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
