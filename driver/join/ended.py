"""A joined job that ended stays ended: its outcome is kept in the store, and a node that
joins the job after it is refused unless it asks for a new job (``--new-job``).

Everything under a job's prefix is deleted when it ends, so without a trace of the end a
node that joins later (a second allocation's node arriving late, a pod restarted after
the training finished) finds no job, leads a fresh one under the same id and trains
from scratch. The leader therefore writes, at the end of a joined job it leads, the
job's ``JobOutcome`` under ``JobKeys.outcome`` (outside the prefix: it outlives the
deletion), and a node checks it before it joins (``check_not_ended``):

* the job finished (``done``) or failed (``failed``), and no driver leads it now: the
  node is refused, in one line naming the job, how and when it ended (``refusal``,
  pure), ``elastic-run`` exits 2 as for a node that disagrees with its job;
* with ``--new-job`` the outcome is deleted instead, and the node goes on to lead a new
  job or join the one another ``--new-job`` node has started;
* a job stopped by a signal (``stopped``) is resumable, not ended: the same command
  resumes it (from ``--checkpoint-dir``), so a node joining it is never refused.

A store client opened with the job's secret signs what it writes and ignores what it
reads without the job's signature (``rendezvous.signing``), so a forged outcome refuses
nobody.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from driver.errors import UsageError
from rendezvous.keys import JobKeys
from rendezvous.schema.record import JsonRecord
from rendezvous.store import Compare, Delete, KVStore, Put

DONE, FAILED, STOPPED = "done", "failed", "stopped"
OUTCOME_KEPT = 24 * 3600.0
"""Seconds an outcome stays in the store, under a lease of its own that nobody keeps
alive (the longest the embedded store grants): long enough for a late node of the same
allocation or a requeue the same day, and no job id's trace stays in a shared etcd for
ever."""
ENDED = (DONE, FAILED)  # the outcomes after which a joining node is refused


@dataclass(frozen=True)
class JobOutcome(JsonRecord):
    """How a joined job ended: ``how`` (``done``, ``failed`` or ``stopped``), ``at``
    (unix time) and ``detail`` (the driver's last line: where training ended, why the
    job failed, which signal stopped it)."""

    how: str
    at: float
    detail: str = ""


def outcome_of(how: str, detail: str, clock=time.time) -> JobOutcome:
    """The outcome ``how`` of now, with ``detail``."""
    return JobOutcome(how, round(clock(), 3), detail)


def refusal(job_id: str, outcome: JobOutcome | None, led: bool, new_job: bool) -> str | None:
    """Why a node may not join job ``job_id`` (None: it may). ``outcome``: the one kept
    in the store (None: none); ``led``: a driver leads the job now (a job started over
    under the id: it is not the one that ended). Pure."""
    if outcome is None or outcome.how not in ENDED or led or new_job:
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(outcome.at))
    how = "finished" if outcome.how == DONE else "failed"
    detail = f" ({outcome.detail})" if outcome.detail else ""
    return (
        f"--join: job {job_id!r} {how} at {when}{detail}; a node that joins it now would "
        "train it again from the start: give --new-job to start a new job under this id, "
        "or another --job-id"
    )


def check_not_ended(store: KVStore, keys: JobKeys, new_job: bool) -> None:
    """Refuse this node when job ``keys.job_id`` ended (see ``refusal``); with
    ``new_job``, forget an ended job's outcome instead (unless a newer outcome was
    written meanwhile), so that the nodes that join after this one join the new job.

    Raises:
        UsageError: the job ended, and ``new_job`` is not set (one line).
        RendezvousError: the store cannot be used.
    """
    kv = store.get(keys.outcome)
    if kv is None:
        return
    try:
        outcome: JobOutcome | None = JobOutcome.from_json(kv.value)
    except (ValueError, TypeError):
        outcome = None  # unreadable: no proof that the job ended
    led = store.get(keys.driver) is not None
    why = refusal(keys.job_id, outcome, led, new_job)
    if why is not None:
        raise UsageError(why)
    if new_job and outcome is not None and outcome.how in ENDED and not led:
        store.txn([Compare(keys.outcome, "mod", "==", kv.mod_revision)], [Delete(keys.outcome)])


def record_outcome(
    store: KVStore, keys: JobKeys, outcome: JobOutcome, fence: Sequence[Compare]
) -> bool:
    """Keep ``outcome`` as job ``keys.job_id``'s for ``OUTCOME_KEPT`` seconds, while
    ``fence`` holds (the leader's, at the end of the joined job, before the job's keys
    are deleted); whether it held.

    Raises:
        RendezvousError: the store cannot be used.
    """
    kept = store.grant_lease(OUTCOME_KEPT)
    return store.txn(list(fence), [Put(keys.outcome, outcome.to_json(), kept.id)]).succeeded
