"""The driver's hold on its job: the leader record under ``JobKeys.driver``, kept
under the driver's own short lease, so the record lives exactly as long as the driver
(the rules it follows: ``driver.leadership.terms``).

* ``DriverClaim.take``: a job id names one live job. With a live leader the start is
  refused (``JobIdInUseError`` names it), or, with ``standby``, waits watching the
  leader key until it vanishes. With no leader and nothing of the job alive, what an
  earlier run left is stale and is deleted; with the job's processes alive, the job is
  adopted (its keys kept). Either way the record is written with the next term in one
  transaction on the leader key's absence and the term key's revision: of two drivers
  starting at once exactly one wins, and no delete can follow a winner's write.
* ``steer``: every steering write goes through it, fenced on the record; a fence that
  fails because another driver leads raises ``LeadershipLost`` (and the driver stops
  steering at once); one that fails because our own lease lapsed takes the key again.
* While the job runs the lease is kept alive. When it is lost (the store was away for
  longer than its TTL), the claim is taken again under a new lease at the same term,
  deleting nothing; a newer term found then means the job was taken over
  (``on_taken``).
* ``release``, at the job's end: the job's keys are deleted, only while the record is
  still this driver's (a successor's keys stay), and the lease is revoked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

from driver.errors import JobEnded, JobFailed, JobIdInUseError, LeadershipLost
from driver.leadership.standby import wait_vacant
from driver.leadership.terms import (
    ClaimAction,
    FenceFailure,
    after_failed_fence,
    claim_action,
    describe_leader,
    fence,
    job_alive,
    keys_deleted_reason,
    lost_reason,
    next_term,
    read_term,
    term_bytes,
)
from driver.threads import spawn
from rendezvous.errors import LeaseNotFoundError, RendezvousAuthError, RendezvousError
from rendezvous.job_secret import check_job_secret
from rendezvous.keys import JobKeys
from rendezvous.retry import Backoff
from rendezvous.schema.leader import DriverRecord
from rendezvous.store import Compare, Delete, KVStore, Lease, Put

log = logging.getLogger(__name__)

DRIVER_LEASE_TTL = 1.0
"""Seconds the leader record outlives a driver that stopped refreshing it (killed, or
cut from the store): how soon a standby may take over. etcd raises a shorter lease to
its own minimum (1.5 x its election timeout, rounded up: 2 s with etcd's defaults).
A false alarm (a driver stalled past it) is harmless: fencing stops the stalled one."""

RETAKE_PATIENCE = 30.0
"""Seconds a steering write keeps taking the seat again while its fence fails on this
driver's own lapsed lease (``DriverClaim._fenced``)."""

BEAT_INTERVAL = 0.25
"""Seconds between two beats of the leader (``JobKeys.leader_beat``, etcd only)."""


@dataclass(frozen=True)
class Taken:
    """How the claim was taken: ``action`` FRESH or ADOPT; ``previous``: the leader a
    standby waited on (None otherwise); ``vacant_at``: when (monotonic) the seat was
    seen empty, for a standby (None otherwise)."""

    action: ClaimAction
    previous: DriverRecord | None = None
    vacant_at: float | None = None


def new_record(term: int = 1) -> DriverRecord:
    """The record of this driver process (a fresh id, this host and pid, now)."""
    return DriverRecord(uuid.uuid4().hex[:12], socket.gethostname(), os.getpid(), time.time(), term)


def describe_driver(record: DriverRecord) -> str:
    """``driver pid P on host H since YYYY-MM-DD HH:MM:SS`` (local time)."""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.started))
    return f"driver pid {record.pid} on host {record.host} since {since}"


class DriverClaim:
    """This driver's claim on ``keys.job_id`` (see the module docstring). Made by
    ``take``; ``on_taken(reason)`` is called (from a claim thread) if the claim is lost
    to another driver."""

    def __init__(
        self,
        store: KVStore,
        keys: JobKeys,
        record: DriverRecord,
        lease: Lease,
        on_taken: Callable[[str], None],
        ttl: float,
    ):
        self.keys = keys
        self.record = record
        self._store = store
        self._lease = lease
        self._on_taken = on_taken
        self._ttl = ttl
        self._released = threading.Event()
        self._lost: str | None = None  # why the lead was lost (then nothing steers)
        self._lock = threading.Lock()  # one retake at a time
        self.taken = Taken(ClaimAction.FRESH)

    @classmethod
    def take(
        cls,
        store: KVStore,
        keys: JobKeys,
        make_record: Callable[[int], DriverRecord],
        *,
        on_taken: Callable[[str], None],
        ttl: float = DRIVER_LEASE_TTL,
        standby: bool = False,
        stop: threading.Event | None = None,
        on_wait: Callable[[DriverRecord], None] | None = None,
        beats: bool = False,
    ) -> DriverClaim:
        """Take the lead of ``keys.job_id`` with the record ``make_record(term)`` (see the
        module docstring); ``standby``: wait while another driver leads (until ``stop``
        is set; ``on_wait(leader)`` is called once each new leader waited on); ``beats``:
        beat while leading (``JobKeys.leader_beat``), so that a standby can tell a dead
        leader within ``driver.leadership.standby.BEAT_SILENCE``. ``claim.taken`` says how it was taken.

        Raises:
            JobIdInUseError: another driver leads (without ``standby``).
            JobEnded: a standby saw its leader go and nothing of the job is left.
            JobFailed: ``stop`` was set while standing by.
            RendezvousError: the store cannot be used.
        """
        waited_on: DriverRecord | None = None
        vacant_at: float | None = None
        while True:
            kvs, revision = store.get_prefix(keys.prefix)
            by_key = {kv.key: kv for kv in kvs}
            leader_kv, term_kv = by_key.get(keys.driver), by_key.get(keys.term)
            leader = DriverRecord.from_json(leader_kv.value) if leader_kv else None
            action = claim_action(
                leader, job_alive(kvs, keys), standby=standby, saw_leader=waited_on is not None
            )
            if action is ClaimAction.REFUSE:
                raise JobIdInUseError(_in_use(keys, leader_kv.value if leader_kv else None))
            if action is ClaimAction.ENDED:
                raise JobEnded(
                    f"job {keys.job_id!r} ended under its leader "
                    f"({describe_leader(waited_on) if waited_on else 'gone'}): "
                    "nothing to take over"
                )
            if action is ClaimAction.WAIT and leader is not None:
                if leader != waited_on and on_wait is not None:
                    on_wait(leader)
                waited_on = leader
                assert leader_kv is not None
                beat = by_key.get(keys.leader_beat)
                beating = beat is not None and beat.lease == leader_kv.lease
                wait_vacant(store, keys, revision, stop, leader_kv.lease, beating)
                vacant_at = time.monotonic()
                continue
            term = next_term(term_kv.value if term_kv else None)
            record = make_record(term)
            term_rev = term_kv.mod_revision if term_kv else 0
            absent = Compare(keys.driver, "create", "==", 0)
            same_term = Compare(keys.term, "mod", "==", term_rev)
            if action is ClaimAction.FRESH:
                # Two steps (etcd refuses a put inside a range the same transaction
                # deletes), each guarded by the seat being empty at the term we read.
                if not store.txn([absent, same_term], [Delete(keys.prefix, prefix=True)]).succeeded:
                    _refuse_forged_seat(store, keys)
                    continue  # another driver moved first: decide again on what it did
                term_rev = 0
            lease = store.grant_lease(ttl)
            won = store.txn(
                [absent, Compare(keys.term, "mod", "==", term_rev)],
                [Put(keys.term, term_bytes(term)), Put(keys.driver, record.to_json(), lease.id)],
            ).succeeded
            if won:
                claim = cls(store, keys, record, lease, on_taken, ttl)
                claim.taken = Taken(action, waited_on, vacant_at)
                lease.keep_alive(on_lost=claim._lease_lost)
                if beats:
                    spawn("leader-beat", claim._beat)
                return claim
            lease.revoke()  # another driver took the seat between our read and write
            _refuse_forged_seat(store, keys)

    def _beat(self) -> None:
        """Rewrite the beat under our lease every ``BEAT_INTERVAL`` while leading."""
        beat = 0
        while not self._released.wait(BEAT_INTERVAL) and self._lost is None:
            beat += 1
            try:
                self._store.put(self.keys.leader_beat, str(beat).encode(), lease=self._lease.id)
            except RendezvousError as exc:  # a lapsed lease: the claim takes it again
                log.debug("leader beat failed: %s", exc)

    @property
    def lost(self) -> str | None:
        """Why the lead was lost (None while this driver leads)."""
        return self._lost

    def steer(self, ops: Sequence[Put | Delete]) -> int:
        """Write ``ops`` in one transaction fenced on this driver's lead; the revision.

        Raises:
            LeadershipLost: another driver leads (nothing was written).
            RendezvousError: the store cannot be used.
        """
        revision = self._fenced(ops, None)
        assert revision is not None  # no condition but the fence, which raises
        return revision

    def steer_unless(self, key: str, ops: Sequence[Put | Delete]) -> int | None:
        """``steer``, but only while ``key`` does not exist: None (nothing written) when
        it does. The absence is checked in the same transaction as the fence.

        Raises:
            LeadershipLost: another driver leads (nothing was written).
            RendezvousError: the store cannot be used.
        """
        return self._fenced(ops, key)

    def _fenced(self, ops: Sequence[Put | Delete], absent: str | None) -> int | None:
        """``ops`` in one transaction that holds while this driver leads (and ``absent``
        does not exist); the revision, or None when ``absent`` exists.

        A fence that fails on our own lapsed lease (the seat empty at our term) is no
        lost lead: the seat is taken again and the write tried again, for as long as
        ``RETAKE_PATIENCE``. With a lease of ``DRIVER_LEASE_TTL`` a re-taken seat can
        lapse again before the next try when the store's client is moving off a dead
        member (its calls hang until they time out); giving up after one re-take once
        made a driver that still held its term leave its job. Only another leader, or
        a newer term, loses the lead.

        Raises:
            LeadershipLost: another driver leads (nothing was written).
            RendezvousError: the store cannot be used, or the seat could not be held
                for a whole ``RETAKE_PATIENCE``.
        """
        condition = [Compare(absent, "version", "==", 0)] if absent is not None else []
        backoff = Backoff.within(RETAKE_PATIENCE, initial=0.05, cap=0.5, stop=self._released)
        while True:
            if self._lost is not None:
                raise LeadershipLost(self._lost)
            result = self._store.txn([*fence(self.keys, self.record), *condition], list(ops))
            if result.succeeded:
                return result.revision
            if absent is not None and self._store.get(absent) is not None:
                return None  # the condition failed, not the fence
            self._after_failed_fence()  # LeadershipLost, or the seat is ours again
            if not backoff.pause():
                raise RendezvousError(
                    f"the lead of job {self.keys.job_id!r} lapsed again after each re-take "
                    f"for {RETAKE_PATIENCE:g}s: the store does not keep this driver's lease"
                )

    def check(self) -> None:
        """Raise ``LeadershipLost`` unless this driver still leads (one fenced
        transaction that writes nothing): the guard before a launch, kill or stop.

        Raises:
            LeadershipLost: another driver leads.
            RendezvousError: the store cannot be used.
        """
        self.steer(())

    def _after_failed_fence(self) -> None:
        """A fence failed: lose the lead (``LeadershipLost``) or take the key again."""
        driver = self._store.get(self.keys.driver)
        term = self._store.get(self.keys.term)
        holder = DriverRecord.from_json(driver.value) if driver else None
        verdict = after_failed_fence(holder, self.record, read_term(term.value if term else None))
        if verdict is FenceFailure.LOST:
            self._lose(lost_reason(self.keys.job_id, holder, self.record))
        lost = self._retake()
        if lost is not None:
            self._lose(lost)

    def step_down(self) -> None:
        """Give the lead up, leaving the job as it is (keys and processes) for another
        driver: the record is deleted (while ours) and the lease revoked.

        Raises:
            RendezvousError: the store cannot be used.
        """
        self._lost = f"this driver stepped down from job {self.keys.job_id!r}"
        self._lease.stop_keep_alive()
        self._store.txn(fence(self.keys, self.record), [Delete(self.keys.driver)])
        with contextlib.suppress(LeaseNotFoundError):
            self._store.revoke(self._lease.id)

    def _lose(self, reason: str) -> None:
        """Leadership is lost: stop refreshing the lease and raise ``LeadershipLost``."""
        self._lost = reason
        self._lease.stop_keep_alive()
        raise LeadershipLost(reason)

    @property
    def lease_id(self) -> int:
        return self._lease.id

    def release(self, store: KVStore) -> None:
        """Delete the job's keys (while the record is still ours) and revoke the lease.
        ``store``: the client to do it with (the caller bounds its deadlines).

        Raises:
            RendezvousError: the store cannot be used.
        """
        self._released.set()
        self._lease.stop_keep_alive()
        ours = [Compare(self.keys.driver, "value", "==", self.record.to_json())]
        store.txn(ours, [Delete(self.keys.prefix, prefix=True)])
        with contextlib.suppress(LeaseNotFoundError):
            store.revoke(self._lease.id)

    # ---- a lost lease ----
    def _lease_lost(self, exc: Exception) -> None:
        """The lease ended while the job runs: take the claim again until it works, the
        job ends, or another driver turns out to hold it. (Runs in the lease's thread,
        which ends after this.)"""
        if self._released.is_set() or self._lost is not None:
            return
        log.warning(
            "the driver's lease on job %r was lost (%s); claiming it again", self.keys.job_id, exc
        )
        backoff = Backoff(None, initial=0.5, cap=2.0, stop=self._released)
        while not self._released.is_set():
            try:
                lost = self._retake()
            except RendezvousError as err:
                log.debug("claiming job %s again failed: %s", self.keys.job_id, err)
            else:
                if lost is None:
                    return
                self._lost = lost
                self._on_taken(lost)
                return
            if not backoff.pause():
                return

    def _retake(self) -> str | None:
        """Write the record again under a new lease, at our term. None when done; why
        this driver does not lead any more when it cannot (another leads, or the job's
        keys were deleted from under it).

        Raises:
            RendezvousError: the store cannot be used (the caller tries again).
        """
        with self._lock:
            store, driver = self._store, self.keys.driver
            current = store.get(driver)
            if (
                current is not None
                and current.value == self.record.to_json()
                and current.lease == self._lease.id
            ):
                return None  # another thread of ours took the seat again already
            lease = store.grant_lease(self._ttl)
            put = [Put(driver, self.record.to_json(), lease.id)]
            absent = [
                Compare(driver, "create", "==", 0),
                Compare(self.keys.term, "value", "==", term_bytes(self.record.term)),
            ]
            ours = fence(self.keys, self.record)
            if store.txn(absent, put).succeeded or store.txn(ours, put).succeeded:
                old, self._lease = self._lease, lease
                lease.keep_alive(on_lost=self._lease_lost)
                # Its keep-alive stops first: the old lease's end is no news.
                with contextlib.suppress(RendezvousError):
                    old.revoke()
                return None
            lease.revoke()
            kv = store.get(driver)
            if kv is not None:
                return lost_reason(self.keys.job_id, DriverRecord.from_json(kv.value), self.record)
            if store.get(self.keys.term) is None:
                return keys_deleted_reason(self.keys.job_id, self.record)
            # The seat is empty but the term moved on: a newer leader came and went.
            return lost_reason(self.keys.job_id, None, self.record)


def check_secret(store: KVStore, keys: JobKeys, secret: str, standby: bool) -> None:
    """Before a claim: refuse a driver whose secret is not the job's, for which every
    record of the job would look forged (a live job stale, its keys deleted). A live
    leader is named first, as ``take`` would (what a second driver of a busy id most
    needs to hear), unless this driver stands by.

    Raises:
        JobIdInUseError: another driver leads (and this one does not stand by).
        RendezvousAuthError: the job runs with another secret.
        RendezvousError: the store cannot be read.
    """
    try:
        check_job_secret(store, keys, secret)
    except RendezvousAuthError:
        # (unchecked: only to name the holder in the refusal, never to act on)
        leader = store.get_unchecked(keys.driver)
        if leader is not None and not standby:
            raise JobIdInUseError(_in_use(keys, leader)) from None
        raise


def _refuse_forged_seat(store: KVStore, keys: JobKeys) -> None:
    """After a claim found the leader's seat taken: refuse to go on when what holds it
    is a record the job did not sign (a stranger's, which every read ignores: the seat
    would look empty for ever, and the claim would spin).

    Raises:
        JobFailed: the seat holds such a record (one line naming the key).
        RendezvousError: the store cannot be read.
    """
    if store.get(keys.driver) is None and store.get_unchecked(keys.driver) is not None:
        raise JobFailed(
            f"job {keys.job_id!r}: the leader's seat {keys.driver} holds a record without "
            "the job's signature (written by a client of the store without the job's "
            "secret); nothing was touched: delete that key or pick another --job-id"
        )


def _in_use(keys: JobKeys, holder_value: bytes | None) -> str:
    if holder_value is None:
        return (
            f"job ID {keys.job_id!r} was just taken by another driver starting at the same "
            "time; pick another --job-id"
        )
    holder = DriverRecord.from_json(holder_value)
    return f"job ID {keys.job_id!r} is running: {describe_driver(holder)}; pick another --job-id"
