"""What the parts of the driver's loop that act on workers share (``WorkerParts``): the
workers' starts, stops and kills (``driver.job.actions``) and the messages about them
(``driver.job.handlers``) both read and change the same four things.

Why one record: those two parts were each given the same four collaborators one by
one, beside what each has of its own (the lead's writes; the chaos); the record says
once what "the workers" are to the loop, and each constructor then shows only what
sets the part apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from driver.job.fenced import FencedStore
from driver.job.processes import HeldWorkers
from driver.job.session import StoreSession
from driver.job.state import JobState


@dataclass(frozen=True)
class WorkerParts:
    """The workers as the job holds them: their records and the round (``state``), the
    store session they register in (``session``), the lead's fenced writes
    (``fenced``), and their processes, launched or adopted (``held``)."""

    state: JobState
    session: StoreSession
    fenced: FencedStore
    held: HeldWorkers
