"""What workers write for the driver: their registration (``WorkerInfo``), their
failure reports (``FailureRecord``), rank 0's progress (``ProgressRecord``, rewritten
every ``progress_period``) and the end of training (``FinishRecord``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from rendezvous.schema.record import JsonRecord


@dataclass(frozen=True)
class WorkerInfo:
    """A worker's registration (written by the worker under its lease).

    ``worker_id`` is unique for the life of the job (a replacement gets a new one);
    ``address`` is the data-plane listener ``host:port`` its peers connect to."""

    worker_id: str
    host: str
    slot: int
    pid: int
    address: str

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> WorkerInfo:
        return cls(**json.loads(data))


@dataclass(frozen=True)
class FailureRecord(JsonRecord):
    """A worker's report to the driver, under ``JobKeys.failure`` (written by worker
    ``worker_id`` under its lease): a collective of round ``round_id`` failed
    (``reason``), or (``silent``) member ``suspect`` has sent nothing for a moment
    (under ``JobKeys.silence``: not a failure yet), or (``hung``, under ``JobKeys.hung``)
    its own training went longer than its hang timeout without a collective: ``reason``
    says how long and where, ``stacks`` is every thread's Python stack. ``suspect``: the
    worker it blames, when it saw that peer stop answering itself (None: a crash needs no
    suspect, the driver sees the process exit; a hung worker names itself).

    Raises (when made):
        TypeError: a field of the wrong type, or one missing (a report is taken whole
            or not at all).
    Raises (``from_json``, besides those):
        ValueError: the bytes are not JSON (or not UTF-8).
    """

    worker_id: str
    round_id: int
    reason: str
    suspect: str | None = None
    silent: bool = False
    hung: bool = False
    stacks: str = ""

    MAX_REASON = 500  # characters of ``reason`` kept (a report is a hint, not a log)
    MAX_STACKS = 32000  # characters of ``stacks`` kept (the hung thread's come first)

    def __post_init__(self):
        checks = (
            ("worker_id", isinstance(self.worker_id, str)),
            ("round_id", isinstance(self.round_id, int) and not isinstance(self.round_id, bool)),
            ("reason", isinstance(self.reason, str)),
            ("suspect", self.suspect is None or isinstance(self.suspect, str)),
            ("silent", isinstance(self.silent, bool)),
            ("hung", isinstance(self.hung, bool)),
            ("stacks", isinstance(self.stacks, str)),
        )
        bad = [name for name, ok in checks if not ok]
        if bad:
            raise TypeError(f"failure report: bad {', '.join(bad)}")
        if len(self.reason) > self.MAX_REASON:
            object.__setattr__(self, "reason", self.reason[: self.MAX_REASON])
        if len(self.stacks) > self.MAX_STACKS:
            object.__setattr__(self, "stacks", self.stacks[: self.MAX_STACKS])


@dataclass(frozen=True)
class FinishRecord(JsonRecord):
    """Under ``JobKeys.finished(worker)`` and ``JobKeys.training_finished``: a worker's
    training function returned in round ``round`` after ``commits`` commits (the
    driver's word that training is done, and the step it ended at); ``worker``: whose
    (empty in records of older versions)."""

    round: int
    commits: int
    worker: str = ""


#: the longest rank 0 goes without rewriting its progress record (``progress_period``)
PROGRESS_PERIOD_MAX = 1.0


def progress_period(interval: float) -> float:
    """How often rank 0 writes its progress record under ``--progress-interval
    interval``: at most every second, and at least once per interval. The driver's
    progress line, said every interval, is then at most a second old, and a record that
    stops coming means rank 0 cannot be heard (the same step is written again while
    training stands still)."""
    return min(interval, PROGRESS_PERIOD_MAX)


@dataclass(frozen=True)
class ProgressRecord(JsonRecord):
    """Training progress under ``JobKeys.progress``: the number of commits (``step``) of
    rank 0 of round ``round_id`` (worker ``worker_id``), which holds the newest commit,
    made in round ``commit_round`` (every member of that round held the state then: a
    commit follows the round's sync and its step's collectives; 0 from older versions).
    Rewritten every ``progress_period``, changed or not."""

    step: int
    round_id: int
    worker_id: str = ""
    commit_round: int = 0
