"""One job per checkpoint folder: the owner record a folder holds, and whether a driver
may run its job on that folder (pure; ``rendezvous.checkpoint_claim`` reads, locks and
writes).

The record (``OwnerRecord``: the job's id, the driver's host and pid, since when) is
the primary fact: a folder belongs to the job it names, across hosts and across the
runs of that job. Whether that job's driver is alive is told two ways. On the record's
own host, by a lock (``flock``) the driver holds on the folder's lock file for its whole
life: a lock that is free there is a dead driver's (the kernel drops it with the
process). From another host a lock may not be seen (``flock`` over NFS is not always
shared between clients), so there a driver also refreshes the record's time every few
seconds (``REFRESH``), and a record older than ``STALE`` is a dead driver's.

What a driver does on a folder (``decide``):

* no record: the folder is taken for this job;
* this job's record (a resumed job, or a driver restarted after a crash): taken again
  while its driver is gone; while it lives, a driver of the same job that may share the
  job (an etcd ``--standby``, a ``--join`` node) goes on beside it and takes the lock
  when it is free, and any other is a second job of the same id, refused;
* no ``--job-id``: the folder's job is this job (the same command started again
  resumes it), as above;
* another job's record: refused while that job's driver lives (one line naming the
  folder and the job); taken over once it is gone, its snapshots kept and not resumed
  (``elastic.snapshots.keeping``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

REFRESH = 5.0
"""Seconds between two refreshes of the record's time by the driver that holds it."""

STALE = 30.0
"""Seconds after which a record another host did not refresh is a dead driver's."""

FORMAT = 1

# What the lock says (``Seen.lock``): this driver holds it; a driver that the kernel
# of this host (or a file system that shares locks) knows holds it; no lock can be
# taken on this file system (the record's time alone then tells a live driver).
HELD, BUSY, NO_LOCKS = "held", "busy", "no-locks"

# What a driver does (``Verdict.action``): take the folder (write its record, hold the
# lock); share it with a live driver of its own job; refuse to run.
TAKE, SHARE, REFUSE = "take", "share", "refuse"


@dataclass(frozen=True)
class OwnerRecord:
    """The job a checkpoint folder belongs to: its ``job_id``, and the ``host`` and
    ``pid`` of the driver that took it (wall-clock ``since``)."""

    job_id: str
    host: str
    pid: int
    since: float
    format: int = FORMAT

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> OwnerRecord:
        """Raises ``ValueError`` on anything a driver does not write."""
        try:
            raw = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError("not an owner record of this version")
        job_id, host, pid, since = (raw.get(k) for k in ("job_id", "host", "pid", "since"))
        if not isinstance(job_id, str) or not job_id or not isinstance(host, str):
            raise ValueError("its job id or host is not a string")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
            raise ValueError(f"its pid {str(pid)[:20]} is not a process id")
        if not isinstance(since, (int, float)) or isinstance(since, bool):
            raise ValueError("its time is not a number")
        return cls(job_id, host, pid, float(since))

    def describe(self) -> str:
        """The holder in words: ``job J (driver pid P on host H, since ...)``."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"job {self.job_id} (driver pid {self.pid} on host {self.host}, since {when})"


@dataclass(frozen=True)
class Claimant:
    """The driver that asks: the ``job_id`` it runs (a fresh one when ``given`` is False:
    no ``--job-id``), its ``host``, and whether another live driver of its job may share
    the folder (``shared``: an etcd store, where a ``--standby`` or a successor leads
    the same job; a ``--join`` node). ``flag``: the folder's flag, named in a refusal
    (``--checkpoint-dir``, or the parameter servers' ``--ps-checkpoint-dir``)."""

    job_id: str
    host: str
    given: bool
    shared: bool
    flag: str = "--checkpoint-dir"


@dataclass(frozen=True)
class Seen:
    """What the folder says: its ``record`` (None: none), seconds since the record was
    last refreshed (``age``, by the file system's own clock), and the ``lock``
    (``HELD``, ``BUSY`` or ``NO_LOCKS``)."""

    record: OwnerRecord | None
    age: float
    lock: str


@dataclass(frozen=True)
class Verdict:
    """What a driver does (``action``) as job ``job_id``; ``why``: the refusal, or what a
    taken folder had (a note to say: "" when nothing is worth saying)."""

    action: str
    job_id: str
    why: str = ""


def holder_lives(seen: Seen, host: str, stale_after: float = STALE) -> bool:
    """Whether the driver of ``seen``'s record may be alive, for a driver on ``host``:
    the lock is busy; or it cannot be told by a lock (another host, or no locks on this
    file system) and the record was refreshed less than ``stale_after`` s ago."""
    if seen.record is None:
        return False
    if seen.lock == BUSY:
        return True
    lock_tells = seen.lock == HELD and seen.record.host == host
    return not lock_tells and seen.age < stale_after


def decide(directory: str, seen: Seen, me: Claimant, stale_after: float = STALE) -> Verdict:
    """What driver ``me`` does on the checkpoint folder ``directory`` (named, with its
    flag, in a refusal) that says ``seen`` (see the module docstring)."""
    record = seen.record
    if record is None:
        return Verdict(TAKE, me.job_id)
    lives = holder_lives(seen, me.host, stale_after)
    where = f"{me.flag} {directory}"
    holder = record.describe()
    if lives and seen.lock != BUSY:  # told by the record's age alone: it may be a dead one's
        holder += (
            f", its record refreshed {seen.age:.0f} s ago (if that driver is gone, the "
            f"folder is free {stale_after - seen.age:.0f} s from now)"
        )
    if record.job_id == me.job_id or not me.given:
        if not lives:
            return Verdict(TAKE, record.job_id)
        if me.given and me.shared:
            return Verdict(SHARE, record.job_id)
        if me.given:
            return Verdict(
                REFUSE,
                record.job_id,
                f"{where} is in use by {holder}: a second driver of one job "
                "needs an etcd store (--rendezvous etcd://... --standby); with the embedded "
                "store it would be a second job on the same snapshots",
            )
    elif not lives:
        return Verdict(
            TAKE,
            me.job_id,
            f"{where} belonged to {record.describe()}, whose driver is gone: job "
            f"{me.job_id} takes it over; job {record.job_id}'s snapshots there are kept, "
            "not resumed (to resume them, run with --job-id "
            f"{record.job_id})",
        )
    return Verdict(
        REFUSE,
        record.job_id,
        f"{where} is in use by {holder}: one job per checkpoint folder; give "
        "this job another folder",
    )
