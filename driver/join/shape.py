"""What every node of a joined job must agree on (pure): the job's size, its command, and
whether it runs worlds of restart mode (``--restart-workers``).

The leader writes it (``JobKeys.shape``) when it claims the job; a node that joins while
a leader leads checks its own against it and is refused, in one line naming the first
difference, when they differ (``check_shape``). A standby checks again when it sees a
new leader and when it takes the job over, so two nodes that start at the same moment
cannot lead one job with two shapes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Protocol

from driver.errors import UsageError

SHAPE_FLAGS = (("np", "-np"), ("min_np", "--min-np"), ("max_np", "--max-np"))


class ShapedJob(Protocol):
    """What the shape reads of a job's configuration (``driver.config.JobConfig`` is
    one: the configuration stands above this package, which it holds as ``join``)."""

    @property
    def job_id(self) -> str: ...

    @property
    def np(self) -> int: ...

    @property
    def min_np(self) -> int: ...

    @property
    def max_np(self) -> int | None: ...

    @property
    def command(self) -> tuple[str, ...]: ...

    @property
    def restart_workers(self) -> bool: ...


def job_shape(config: ShapedJob) -> dict:
    """This node's shape of the job."""
    return {
        "np": config.np,
        "min_np": config.min_np,
        "max_np": config.max_np,
        "command": list(config.command),
        "restart_workers": config.restart_workers,
    }


def shape_difference(mine: Mapping, theirs: Mapping) -> str:
    """How this node's shape differs from the job's, in words ("" when it does not)."""
    for key, flag in SHAPE_FLAGS:
        if mine.get(key) != theirs.get(key):
            return f"{flag} {_shown(mine.get(key))} here, {_shown(theirs.get(key))} in the job"
    if bool(mine.get("restart_workers")) != bool(theirs.get("restart_workers")):
        # (a shape written before restart mode existed has no such key: not given)
        here, there = ("given", "not") if mine.get("restart_workers") else ("not given", "given")
        return f"--restart-workers {here} here, {there} in the job"
    if mine.get("command") != theirs.get("command"):
        return (
            f"the command {' '.join(mine.get('command') or [])!r} here, "
            f"{' '.join(theirs.get('command') or [])!r} in the job"
        )
    return ""


def _shown(value: object) -> str:
    return "unset" if value is None else str(value)


def shape_bytes(config: ShapedJob) -> bytes:
    """``job_shape`` as the store holds it."""
    return json.dumps(job_shape(config)).encode()


def check_shape(config: ShapedJob, stored: bytes | None) -> None:
    """Refuse this node when the job's shape as stored (``stored``; None: not written
    yet) differs from its own.

    Raises:
        UsageError: one line naming the first difference (the job is untouched).
    """
    if stored is None:
        return
    difference = shape_difference(job_shape(config), json.loads(stored))
    if difference:
        raise UsageError(f"--join: this node disagrees with job {config.job_id!r}: {difference}")
