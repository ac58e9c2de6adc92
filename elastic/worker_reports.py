"""What a worker tells the driver through the store: a collective's failure (with the
peer to blame, when there is one), a peer's silence, rank 0's progress, and the end of
its training.

The records and the writes, apart from ``elastic.runtime`` (a worker's membership),
which calls them with its store, its registration's lease and keys.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Protocol

from elastic.errors import CommunicatorClosedError, LossCause, PeerLostError
from rendezvous.errors import LeaseNotFoundError, RendezvousError
from rendezvous.host_plan import RoundView
from rendezvous.keys import JobKeys
from rendezvous.schema.rounds import Member
from rendezvous.schema.workers import FailureRecord, FinishRecord, ProgressRecord, progress_period
from rendezvous.store import Compare, KVStore, Put
from rendezvous.store_reach import StoreReach

log = logging.getLogger(__name__)


class Progressing(Protocol):
    """What ``publish_progress`` reads of a worker's runtime."""

    keys: JobKeys
    committed: int
    commit_round: int
    store_reach: StoreReach

    @property
    def store(self) -> KVStore | None: ...

    @property
    def member(self) -> Member | None: ...

    @property
    def round_id(self) -> int: ...


#: while this worker has published nothing, it looks for its first commit this often: the
#: driver learns at once that the workers commit a state (what a round that lost every
#: holder of it would lose)
FIRST_COMMIT_LOOK = 0.2


def publish_progress(
    runtime: Progressing, worker_id: str, interval: float, closed: threading.Event
) -> None:
    """While rank 0: write the commit count to ``JobKeys.progress`` as soon as it first
    commits, then every ``progress_period(interval)`` seconds, changed or not, until
    ``closed`` (a thread of the runtime's own). The unchanged count is written again so
    that the driver tells training that stands still from a rank 0 it cannot hear, and
    measures its rate over a window whose ends it saw."""
    period = progress_period(interval)
    published = False
    while not closed.wait(period if published else min(period, FIRST_COMMIT_LOOK)):
        committed, member, store = runtime.committed, runtime.member, runtime.store
        if member is None or member.rank != 0 or not committed or store is None:
            continue
        record = ProgressRecord(committed, runtime.round_id, worker_id, runtime.commit_round)
        try:
            with runtime.store_reach.looking():
                store.put(runtime.keys.progress, record.to_json())
            published = True
        except RendezvousError as exc:  # progress is a report: the next one will do
            log.debug("could not publish progress: %s", exc)


def suspect_of(exc: Exception, plan: RoundView | None) -> str | None:
    """The worker to blame for ``exc``, when this worker saw it stop answering itself
    (``PeerLostError`` with ``direct`` and ``LossCause.SILENT``: SIGSTOP, a hang, a peer
    that never connects to build the round). A crash needs no suspect: the driver sees
    the process exit, and the cascade of closed sockets would blame innocent neighbours."""
    if not isinstance(exc, PeerLostError) or plan is None:
        return None
    rank = exc.rank
    if rank is None or not exc.direct or exc.cause is not LossCause.SILENT:
        return None
    if not 0 <= rank < plan.size:
        return None
    return plan.worker_at(rank)


def worth_reporting(exc: Exception) -> bool:
    """Whether a worker whose collective failed with ``exc`` reports it: not when its
    round was superseded (``CommunicatorClosedError``: no loss), nor when it only heard
    of the loss from another member (``LossCause.RELAYED``), which saw it and reports
    it. Otherwise every member of a round of thousands would write a report for one
    loss, all at the moment the next round is being planned; the driver learns of the
    loss from the members that saw it, the process exit, or the lease."""
    if isinstance(exc, CommunicatorClosedError):
        return False
    return not (isinstance(exc, PeerLostError) and exc.cause is LossCause.RELAYED)


def failure_record(worker_id: str, round_id: int, reason: str, suspect: str | None) -> bytes:
    """The failure report of ``worker_id``: a collective of ``round_id`` failed."""
    return FailureRecord(worker_id, round_id, reason, suspect).to_json()


def silence_report(
    keys: JobKeys, worker_id: str, plan: RoundView, rank: int, quiet: float
) -> tuple[str, bytes] | None:
    """The key and record of ``worker_id``'s report that member ``rank`` of ``plan`` has
    sent nothing for ``quiet`` seconds (None: the member is not one this host knows,
    so not a peer of this worker)."""
    suspect = plan.worker_at(rank)
    if suspect is None:
        return None
    reason = f"silent for {quiet:.1f}s"
    record = FailureRecord(worker_id, plan.round_id, reason, suspect, silent=True).to_json()
    return keys.silence(plan.round_id, worker_id, suspect), record


def put_report(store: KVStore | None, lease: int, key: str, record: bytes) -> None:
    """Write a report under the lease of the worker's registration (its own, or its
    agent's: the report ends with it; best effort, never raises)."""
    if store is None or not lease:
        return
    try:
        store.put(key, record, lease=lease)
    except (RendezvousError, LeaseNotFoundError) as exc:
        log.debug("could not report: %s", exc)


def training_finished(store: KVStore, keys: JobKeys) -> FinishRecord | None:
    """The finish record of the job (``JobKeys.training_finished``), if a worker wrote
    one: the training is complete. None when there is none, or it cannot be read now
    (best effort: the caller asks again). Never raises."""
    try:
        kv = store.get(keys.training_finished)
        return FinishRecord.from_json(kv.value) if kv is not None else None
    except (RendezvousError, ValueError, TypeError) as exc:
        log.debug("could not read the finish record: %s", exc)
        return None


def record_finish(
    store: KVStore,
    keys: JobKeys,
    plan: RoundView,
    worker_id: str,
    commits: int,
    current: Callable[[], RoundView | None],
) -> RoundView | None:
    """Say in the store that ``worker_id``'s training function returned in ``plan``'s
    round: the training is complete (the driver then forms no new round: see
    ``driver.policy``). Written without a lease, so it outlives the process, and only
    while the round's head still holds this round (one transaction; the driver
    publishes only while no finish is recorded, ``JobKeys.training_finished``; the head
    and the whole plan change together). ``current`` reads the round the store holds.

    Returns the newer round that includes ``worker_id``, published first (its members
    wait for this worker, which must join it), else None (the finish is recorded, or the
    store cannot be reached: best effort). Never raises."""
    record = FinishRecord(plan.round_id, commits, worker_id).to_json()
    try:
        result = store.txn(
            [Compare(keys.plan_head, "value", "==", plan.head.to_json())],
            [Put(keys.finished(worker_id), record), Put(keys.training_finished, record)],
        )
        if result.succeeded:
            return None
        newer = current()
    except RendezvousError as exc:
        log.warning("could not say that this worker finished: %s", exc)
        return None
    if newer is None or newer.member(worker_id) is None:
        return None  # a round without this worker: nobody waits for it
    return newer
