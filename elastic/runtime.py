"""The worker's side of the round protocol: register, follow rounds, build communicators.

A worker launched by ``elastic-run`` finds its job in the environment (``rendezvous.env``,
read into ``elastic.worker_settings.WorkerSettings``):

1. it opens its data-plane listener, then registers ``WorkerInfo`` at
   ``/elastic/<job>/workers/<id>`` and follows the job's rounds through its round feed
   (``elastic.follow``: under a lease and a watch of its own, or through its host's
   agent, which holds one lease and one watch for the host);
2. the feed hands it every newer round (not a poll per step); a newer round closes the
   current communicator at once, so any collective in flight raises
   ``WorkerLostError`` instead of hanging on a peer that is gone;
3. ``join(after_round)`` waits for a plan newer than ``after_round`` that includes this
   worker and builds the communicator for it.

A warm spare (``--spares``; ``ELASTIC_SPARE=1``) does the same, but its first wait has
no deadline: it sits in ``elastic.init()`` until the driver promotes it into a round,
however long that takes. The wait costs nothing: the thread sleeps on a condition
that the round feed wakes when a plan arrives (a plan that leaves it out puts it
back to sleep), not on a poll of the store.

Plans carry the leader term of the driver that wrote them: a worker remembers the
newest term it has taken and refuses (logs and ignores) a plan of an older one, so a
driver that lost the lead (paused, then woken up after a takeover) steers nothing even
if a write of it slipped past its fence.

A worker that sees a collective fail reports it under ``/elastic/<job>/failures/`` so the
driver learns of it even when it cannot see the peer's process (a remote host). A ring
neighbour that has gone silent (``CommSettings.suspect_after``) is reported there too,
at once, while the collective still waits: a host cut off the network sends nothing
else, and the driver can ask that host whether it is still there. (The records and their
writes: ``elastic.worker_reports``.)

Rank 0 publishes how many commits it holds (``committed``, set by ``State.commit``)
under ``/elastic/<job>/progress`` from a thread of its own, every
``rendezvous.schema.workers.progress_period`` (at most a second, at least once per
``progress_interval``): one store write per period per job, never one per step, and
nothing on the training thread.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time

from elastic import worker_reports
from elastic.comm import Communicator, Membership, RingCommunicator, RingListener
from elastic.errors import (
    SHUT_DOWN,
    TrainingFinishedError,
    WorkerExpelledError,
    WorkerHandedOverError,
    WorkerLostError,
)
from elastic.follow import FeedHooks, FeedSettings, RoundFeed, feed_name, open_feed
from elastic.orphan import exit_when_orphaned
from elastic.rounds import RoundReader
from elastic.worker_settings import WorkerSettings
from rendezvous import open_store
from rendezvous.errors import (
    RendezvousConnectionError,
    RendezvousError,
)
from rendezvous.host_plan import RoundView
from rendezvous.job_secret import check_job_secret
from rendezvous.keys import JobKeys
from rendezvous.schema.rounds import Member, handover_for, plan_is_current
from rendezvous.schema.workers import WorkerInfo
from rendezvous.store import KVStore
from rendezvous.store_reach import StoreReach

log = logging.getLogger(__name__)

#: an idle spare's wait for its round wakes at least this often (a plan wakes it at once)
SPARE_WAKE = 60.0
#: a member waiting for its next round reads the job's finish record this often: no
#: round forms after a finish, so a member that lost its round at the last step, or a
#: newcomer of the job's last moment, learns from it that the job is done
FINISH_POLL = 0.25


class WorkerRuntime:
    """One worker's membership in the job; thread-safe."""

    def __init__(self, settings: WorkerSettings):
        self.settings = settings
        self.keys = JobKeys(settings.job_id)
        self._cond = threading.Condition()
        self._latest: RoundView | None = None  # newest round seen (may not include us)
        self.term_seen = 0  # the newest leader term of a plan taken: older ones are refused
        self.plan: RoundView | None = None  # the round our communicator belongs to
        self.comm: Communicator | None = None
        self._store: KVStore | None = None
        self._rounds: RoundReader | None = None
        self._feed: RoundFeed | None = None
        self._listener: RingListener | None = None
        self._closed = threading.Event()
        self._info: WorkerInfo | None = None
        self._orphan_watch: threading.Event | None = None
        self._expelled = False  # the driver took us out: no round will include us again
        self._handed_over = False  # left out of a handover: our host leaves the job
        # The round whose ring join() is building (None: none): a newer round ends that
        # build at once, a handover too (the step a handover lets finish is on the ring
        # this worker already left).
        self._forming: int | None = None
        self.committed = 0  # commits this worker holds (``State.commit`` sets it)
        # The round of its newest commit: a commit is made after the round's sync and
        # its step's collectives, so every member of that round holds the state.
        self.commit_round = 0
        # How the store took rank 0's progress writes: while it is away, rank 0 writes
        # the snapshots alone (``elastic.snapshots.snapshotter``).
        self.store_reach = StoreReach()

    # ---- start / stop ----
    def start(self) -> None:
        """Open the store, the listener, register, and follow rounds.

        Raises RendezvousError when the store cannot be reached or refuses us."""
        s = self.settings
        self._orphan_watch = exit_when_orphaned()
        self._store = open_store(s.store_url, s.secret)
        self._rounds = RoundReader(self._store, self.keys, s.host, self._closed)
        check_job_secret(self._store, self.keys, s.secret)  # (etcd does not check it)
        self._listener = RingListener(bind_host=s.bind_host, secret=s.secret)
        self._info = WorkerInfo(s.worker_id, s.host, s.slot, os.getpid(), self._listener.address)
        feed = FeedSettings(s.worker_id, s.lease_ttl, s.round_timeout, s.agent_socket)
        hooks = FeedHooks(
            on_round=self._note_plan,
            newest=lambda: self._latest.round_id if self._latest is not None else 0,
            closed=self._closed,
            cut_off=lambda: os.kill(os.getpid(), signal.SIGTERM),  # (its handlers run)
        )
        self._feed = open_feed(
            feed_name(feed), feed, hooks, store=self._store, keys=self.keys, rounds=self._rounds
        )
        self._feed.start(self._info)
        if s.progress_interval > 0:
            threading.Thread(
                target=worker_reports.publish_progress,
                args=(self, s.worker_id, s.progress_interval, self._closed),
                name="elastic-progress",
                daemon=True,
            ).start()

    def _started(self) -> tuple[KVStore, RingListener, WorkerInfo]:
        """What ``start()`` opened. Raises RendezvousError before ``start()``."""
        if self._store is None or self._listener is None or self._info is None:
            raise RendezvousError("the worker runtime has not been started")
        return self._store, self._listener, self._info

    def shutdown(self) -> None:
        """Leave the job: close the communicator, end the registration, close the store."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._orphan_watch is not None:
            self._orphan_watch.set()
        with self._cond:
            comm, self.comm = self.comm, None
            self._cond.notify_all()
        if comm is not None:
            comm.close(SHUT_DOWN)
        if self._feed is not None:
            self._feed.close()  # (the registration stays until the process exits)
        if self._listener is not None:
            self._listener.close()
        if self._store is not None:
            self._store.close()

    @property
    def store(self) -> KVStore | None:
        """The worker's client of the job's store (None before ``start``)."""
        return self._store

    @property
    def lease_id(self) -> int:
        """The lease of the worker's registration (its own, or its agent's; 0: none)."""
        return self._feed.lease_id if self._feed is not None else 0

    # ---- rounds ----
    def _note_plan(self, plan: RoundView) -> None:
        with self._cond:
            if not plan_is_current(plan, self._latest, self.term_seen):
                if plan.term < self.term_seen:
                    log.warning(
                        "ignoring round %d of leader term %d: a driver of term %d leads "
                        "the job now",
                        plan.round_id,
                        plan.term,
                        self.term_seen,
                    )
                return
            # A handover: finish the step in flight on the old ring and change rounds at
            # the next commit (``State.commit`` sees the pending round), instead of
            # abandoning the step now; one that leaves us out ends us there.
            defer, handed_over = handover_for(
                plan, self._latest, self.plan, self.settings.worker_id
            )
            if self._forming is not None and self._forming < plan.round_id:
                defer = False
            self._latest = plan
            self.term_seen = max(self.term_seen, plan.term)
            left_out = self.member is not None and plan.member(self.settings.worker_id) is None
            self._handed_over = self._handed_over or handed_over
            self._cond.notify_all()
        if defer:
            return
        if left_out:
            # Left out of a round while a member of ours: expelled, if the driver also
            # removed our registration (a mere shrink stops us; a lost host's workers
            # find out here once they can reach the store again).
            threading.Thread(
                target=self._check_expelled, name="elastic-expelled", daemon=True
            ).start()
        if self._listener is not None:
            # A new round ends the old one now: a collective blocked on a peer that is
            # gone raises instead of waiting for a timeout, and a communicator still
            # being built for an older round gives up.
            self._listener.advance(plan.round_id)

    def _check_expelled(self) -> None:
        store = self._store
        if store is None or self._closed.is_set():
            return
        try:
            registered = store.get(self.keys.worker(self.settings.worker_id)) is not None
        except RendezvousError as exc:
            log.debug("cannot tell whether this worker is still in the job: %s", exc)
            return
        if not registered:
            with self._cond:
                self._expelled = True
                self._cond.notify_all()
            log.warning(
                "worker %s was taken out of the job (left out of round %d, its registration "
                "removed); ending it",
                self.settings.worker_id,
                self._latest.round_id if self._latest else 0,
            )

    def pending_round(self) -> int | None:
        """The id of a published round newer than ours, or None (cheap: no I/O)."""
        with self._cond:
            latest, plan = self._latest, self.plan
            if latest is not None and plan is not None and latest.round_id > plan.round_id:
                return latest.round_id
            return None

    def newer_round_pending(self) -> bool:
        """True when a round newer than ours has been published (cheap: no I/O)."""
        return self.pending_round() is not None

    @property
    def round_id(self) -> int:
        return self.plan.round_id if self.plan is not None else 0

    @property
    def member(self) -> Member | None:
        """This worker's place in its current round (None before the first round)."""
        plan = self.plan
        return plan.member(self.settings.worker_id) if plan is not None else None

    def join(self, after_round: int | None = None) -> RoundView:
        """Wait for a plan newer than ``after_round`` (default: our current round) that
        includes us, and build its communicator.

        Raises:
            RendezvousError: no such round comes within ``round_timeout``.
            WorkerHandedOverError: a handover left this worker out (its host leaves).
            TrainingFinishedError: another worker finished the training meanwhile (its
                commit is the job's result): no round will come.
        """
        _, listener, _ = self._started()
        after = self.round_id if after_round is None else after_round
        # A spare not yet promoted waits as long as the job keeps it (see the docstring).
        idle_spare = self.settings.spare and self.plan is None
        deadline = None if idle_spare else time.monotonic() + self.settings.round_timeout
        while True:
            poll_at = None if deadline is None else time.monotonic() + FINISH_POLL
            found = self._wait_for_plan(after, deadline, poll_at)
            if found is None:
                self._raise_if_training_finished()
                continue
            plan, me = found
            if deadline is None:  # promoted: from now on it waits like any worker
                deadline = time.monotonic() + self.settings.round_timeout
            assert self._rounds is not None
            membership = Membership(
                round_id=plan.round_id,
                rank=me.rank,
                addresses=self._rounds.addresses(plan),
                secret=self.settings.secret,
                world=plan.size,
            )
            with self._cond:
                if self.superseded(plan.round_id):
                    after = plan.round_id  # (a newer round came as this one was read)
                    continue
                self._forming = plan.round_id
            try:
                comm = RingCommunicator(
                    membership,
                    listener,
                    self.settings.comm,
                    on_peer_silent=functools.partial(self.report_silence, plan),
                )
            except WorkerLostError as exc:
                log.info("round %d could not form (%s); waiting for the next", plan.round_id, exc)
                self.report_loss(plan, exc)
                after = plan.round_id
                continue
            finally:
                with self._cond:
                    self._forming = None
            with self._cond:
                if self.superseded(plan.round_id):
                    comm.close("superseded while forming")
                    after = plan.round_id
                    continue
                old, self.comm, self.plan = self.comm, comm, plan
            if old is not None:
                old.close("replaced")
            return plan

    def superseded(self, round_id: int) -> bool:
        """True when round ``round_id`` is over for this worker: a newer one was
        published, or the worker is closing (cheap: no I/O)."""
        latest = self._latest
        return self._closed.is_set() or (latest is not None and latest.round_id > round_id)

    def _raise_if_training_finished(self) -> None:
        """Raise ``TrainingFinishedError`` when the job's finish record is in the store
        (read with no lock held: the round feed must not wait on it).

        Raises:
            TrainingFinishedError: a worker's training function returned having
                committed the final step.
        """
        if self._store is None:
            return
        record = worker_reports.training_finished(self._store, self.keys)
        if record is None:
            return
        who = f"worker {record.worker}" if record.worker else "another worker"
        raise TrainingFinishedError(
            f"the training finished in round {record.round} at step {record.commits} "
            f"({who}): that commit is the job's result, and this worker, which had "
            f"committed {self.committed} steps, has nothing left to do"
        )

    def _wait_for_plan(
        self, after: int, deadline: float | None, poll_at: float | None = None
    ) -> tuple[RoundView, Member] | None:
        """The first plan newer than ``after`` that includes this worker, and its place
        (``deadline`` None: an idle spare's wait, for as long as the job keeps it); None
        when ``poll_at`` comes first (the caller looks at the store, then waits again).

        Raises:
            RendezvousError: the worker shut down meanwhile.
            WorkerExpelledError: the driver took this worker out of the job.
            WorkerHandedOverError: a handover left this worker out: its host leaves.
            RendezvousConnectionError: no such plan came before ``deadline``.
        """
        me = self.settings.worker_id
        with self._cond:
            while True:
                if self._closed.is_set():
                    raise RendezvousError("worker is shut down")
                if self._handed_over:
                    raise WorkerHandedOverError(
                        f"worker {me} leaves the job: its host is drained, and the others go "
                        "on from the commit it holds too"
                    )
                if self._expelled:
                    raise WorkerExpelledError(
                        f"worker {me} was taken out of the job by the driver (a newer round "
                        "left it out and removed its registration); its state is stale"
                    )
                plan = self._latest
                member = plan.member(me) if plan is not None else None
                if plan is not None and plan.round_id > after and member is not None:
                    return plan, member
                if deadline is None:
                    # Every change that matters (a plan, the shutdown, an expulsion)
                    # notifies the condition: the timeout is only a safety net.
                    self._cond.wait(SPARE_WAKE)
                    continue
                now = time.monotonic()
                if poll_at is not None and now >= poll_at:
                    return None
                remaining = deadline - now
                if remaining <= 0:
                    have = (
                        f"round {plan.round_id} ({plan.size} workers)" if plan else "no round yet"
                    )
                    raise RendezvousConnectionError(
                        f"worker {me} waited {self.settings.round_timeout:.0f}s for a round after "
                        f"{after} that includes it; the store has {have}"
                    )
                self._cond.wait(min(remaining, 1.0, (poll_at or now + 1.0) - now))

    def report_silence(self, plan: RoundView, rank: int, quiet: float) -> None:
        """Tell the driver that member ``rank`` of ``plan`` has sent nothing for ``quiet``
        seconds (best effort, never raises; runs on the ring's monitor thread, so it
        hands the write to a thread of its own and returns at once)."""
        if self._store is None or not self.lease_id or not 0 <= rank < plan.size:
            return
        report = worker_reports.silence_report(
            self.keys, self.settings.worker_id, plan, rank, quiet
        )
        if report is None:
            return
        key, record = report
        threading.Thread(
            target=self._put_report, args=(key, record), name="report-silence", daemon=True
        ).start()

    def _put_report(self, key: str, record: bytes) -> None:
        worker_reports.put_report(self._store, self.lease_id, key, record)

    def mark_finished(self) -> bool:
        """Say in the store that this worker's training function returned in its round
        (``elastic.worker_reports.record_finish``).

        Returns True when the training may end here: the finish is recorded (or the
        store cannot be reached: best effort). False when a newer round that includes
        this worker was published first: its members wait for this worker, which must
        join it with its last commit. Never raises."""
        store, plan = self._store, self.plan
        if store is None or plan is None or self._closed.is_set():
            return True
        me = self.settings.worker_id
        assert self._rounds is not None
        newer = worker_reports.record_finish(
            store, self.keys, plan, me, self.committed, self._rounds.current
        )
        if newer is None:
            return True
        log.info("round %d formed as training ended here: joining it", newer.round_id)
        self._note_plan(newer)  # join() need not wait for the watch to deliver it
        return False

    def report_loss(self, plan: RoundView | None, exc: Exception) -> None:
        """Tell the driver a collective of round ``plan`` failed with ``exc``, when it is
        worth it (``worker_reports.worth_reporting``), naming its suspect (best effort)."""
        if plan is not None and worker_reports.worth_reporting(exc):
            self.report_failure(plan.round_id, str(exc), worker_reports.suspect_of(exc, plan))

    def report_failure(self, round_id: int, reason: str, suspect: str | None = None) -> None:
        """Tell the driver a collective of ``round_id`` failed (best effort, never raises)."""
        if self._store is None or not self.lease_id:
            return
        record = worker_reports.failure_record(self.settings.worker_id, round_id, reason, suspect)
        self._put_report(self.keys.failure(round_id, self.settings.worker_id), record)
