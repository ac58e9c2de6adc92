"""What the driver's main loop knows of the job and hands its rules: the workers'
records, the round published, the book (``JobState``). One object shared by the parts of
the loop (``driver.job.loop``, ``driver.job.lead``, ``driver.job.actions``,
``driver.job.handlers``), only ever touched from the loop's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from driver.policy import decisions as dec
from driver.policy.lifecycle import WorkerRecord
from rendezvous.schema.rounds import Plan


@dataclass
class JobState:
    """The job as the main loop knows it."""

    book: dec.Book
    workers: dict[str, WorkerRecord] = field(default_factory=dict)
    plan: Plan | None = None

    def take(self, step: dec.Step) -> Sequence[dec.Decision]:
        """Keep a rule's book; returns its decisions, to be carried out."""
        decisions, self.book = step
        return decisions

    def any_registered(self) -> bool:
        """A worker of this job has registered: its program can start."""
        return any(r.ever_registered for r in self.workers.values())
