"""What the coordinating shard says of checkpoints that fail (``CheckpointFailures``).

A checkpoint that fails is tried again at the next interval; while the cause lasts (a
full disk, a shard that does not answer) every attempt fails, each second with a short
interval. So a streak of failures is said at its first failure, then at most once every
``REPORT_INTERVAL`` seconds with the count of attempts so far: one warning in the
shard's log and one ``CheckpointFailedRecord`` for the driver (``report``), which shows
it. A stop's final checkpoint that cannot be written is always said, and says what a
restart resumes from. The first checkpoint written after failures ends the streak, in
the log.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from rendezvous.schema.ps import CheckpointFailedRecord

log = logging.getLogger("ps.shard.coordinator")

REPORT_INTERVAL = 60.0
"""Seconds between two reports of one streak of failed checkpoints."""


def describe(record: CheckpointFailedRecord) -> str:
    """The one line that says ``record`` (the shard's log line)."""
    newest = f"checkpoint {record.newest} (step {record.newest_step})"
    if record.final:
        resume = "starts from the beginning" if record.newest is None else f"resumes from {newest}"
        return f"no final checkpoint for the stop: {record.error}; a restart {resume}"
    step = f" (step {record.step})" if record.step is not None else ""
    tries = f"{record.attempts} attempts in a row" if record.attempts > 1 else "first attempt"
    has = "none is complete yet" if record.newest is None else f"the newest complete is {newest}"
    return f"checkpoint {record.checkpoint_id}{step} failed ({tries}): {record.error}; {has}"


class CheckpointFailures:
    """The streak of failed checkpoint attempts of the shards whose checkpoints go to
    ``checkpoint_dir``, said as the module doc describes; ``report(record)`` passes a
    report on (None: the log only). Thread-safe: the periodic checkpoints and the
    checkpoints a stop asks for fail from different threads."""

    def __init__(
        self,
        checkpoint_dir: str,
        report: Callable[[CheckpointFailedRecord], None] | None = None,
        interval: float = REPORT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._dir = checkpoint_dir
        self._report = report
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._attempts = 0  # failed in a row
        self._next_report = 0.0  # (clock) a streak's next report is due then

    @property
    def attempts(self) -> int:
        """Failed attempts in a row so far (0: the last one was written)."""
        with self._lock:
            return self._attempts

    def failed(
        self,
        checkpoint_id: int,
        step: int | None,
        error: str,
        newest: tuple[int, int] | None,
        final: bool = False,
    ) -> CheckpointFailedRecord | None:
        """Attempt ``checkpoint_id`` (of the shards' ``step``, None: not known) failed
        for ``error`` (one line); ``newest``: the newest complete checkpoint's (id,
        step), None: none. ``final``: the shards stop without the checkpoint. Returns
        the report when one is due now (logged, and given to ``report``), else None."""
        with self._lock:
            self._attempts += 1
            now = self._clock()
            if not final and now < self._next_report:
                return None
            self._next_report = now + self._interval
            record = CheckpointFailedRecord(
                checkpoint_id,
                step,
                self._dir,
                error,
                self._attempts,
                final,
                newest[0] if newest is not None else None,
                newest[1] if newest is not None else None,
            )
        log.warning("%s", describe(record))
        if self._report is not None:
            self._report(record)
        return record

    def written(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: a streak of failures ends."""
        with self._lock:
            attempts, self._attempts, self._next_report = self._attempts, 0, 0.0
        if attempts:
            log.info(
                "checkpoint %d written, after %d failed attempt%s",
                checkpoint_id,
                attempts,
                "" if attempts == 1 else "s",
            )
