"""The driver's hold on its job id: a ``DriverRecord`` under ``JobKeys.driver``, kept
under the driver's own lease, so that the record lives exactly as long as the driver.

* ``DriverClaim.take``: a job id names one live job. When another driver's record is
  there (its lease alive), the id is taken: ``JobIdInUseError`` names that driver.
  When none is, whatever an earlier run left under the job's prefix is stale and is
  deleted, then the record is written. Both steps are guarded by the record's absence:
  of two drivers starting at once exactly one wins, and no delete can follow a
  winner's write.
* While the job runs the lease is kept alive. When it is lost (the store was away for
  longer than its TTL), the claim is taken again under a new lease, deleting nothing;
  another driver's record found then means the job id was taken over (``on_taken``).
* ``release``, at the job's end: the job's keys are deleted, only while the record is
  still this driver's (a successor's keys stay), and the lease is revoked.

The record's ``term`` is 1 for the driver that starts a job; driver failover (a new
leader adopting a running job) will give each new leader the previous term + 1.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from typing import Callable

from driver.errors import JobIdInUseError
from rendezvous.errors import LeaseNotFoundError, RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.plan import DriverRecord
from rendezvous.retry import Backoff
from rendezvous.store import Compare, Delete, KeyValue, KVStore, Lease, Put

log = logging.getLogger(__name__)

DRIVER_LEASE_TTL = 10.0
"""Seconds the driver's record outlives a driver that stopped refreshing it (killed, or
cut from the store): how long its job id stays taken after it is gone."""


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

    @classmethod
    def take(
        cls,
        store: KVStore,
        keys: JobKeys,
        record: DriverRecord,
        *,
        on_taken: Callable[[str], None],
        ttl: float = DRIVER_LEASE_TTL,
    ) -> DriverClaim:
        """Claim the job id for ``record``'s driver, deleting stale keys of the job.

        Raises:
            JobIdInUseError: another driver's record is alive.
            RendezvousError: the store cannot be used.
        """
        absent = [Compare(keys.driver, "create", "==", 0)]
        if store.txn(absent, [Delete(keys.prefix, prefix=True)]).succeeded:
            lease = store.grant_lease(ttl)
            if store.txn(absent, [Put(keys.driver, record.to_json(), lease.id)]).succeeded:
                claim = cls(store, keys, record, lease, on_taken, ttl)
                lease.keep_alive(on_lost=claim._lease_lost)
                return claim
            lease.revoke()  # another driver wrote its record between our two steps
        raise JobIdInUseError(_in_use(keys, store.get(keys.driver)))

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
        if self._released.is_set():
            return
        log.warning("the driver's lease on job %s was lost (%s); claiming it again", self.keys, exc)
        backoff = Backoff(None, initial=0.5, cap=2.0, stop=self._released)
        while not self._released.is_set():
            try:
                holder = self._retake()
            except RendezvousError as err:
                log.debug("claiming job %s again failed: %s", self.keys.job_id, err)
                holder = None
            else:
                if holder is None:
                    return
                self._on_taken(
                    f"another driver took over job ID {self.keys.job_id!r}: "
                    f"{describe_driver(holder)}"
                )
                return
            if not backoff.pause():
                return

    def _retake(self) -> DriverRecord | None:
        """Write the record again under a new lease. None when done; the other driver's
        record when another holds the claim.

        Raises:
            RendezvousError: the store cannot be used (the caller tries again).
        """
        store, driver = self._store, self.keys.driver
        lease = store.grant_lease(self._ttl)
        put = [Put(driver, self.record.to_json(), lease.id)]
        absent = [Compare(driver, "create", "==", 0)]
        ours = [Compare(driver, "value", "==", self.record.to_json())]
        if store.txn(absent, put).succeeded or store.txn(ours, put).succeeded:
            old, self._lease = self._lease, lease
            lease.keep_alive(on_lost=self._lease_lost)
            with contextlib.suppress(RendezvousError):
                store.revoke(old.id)
            return None
        lease.revoke()
        kv = store.get(driver)
        if kv is None:
            raise RendezvousError("the driver record vanished while claiming it again")
        return DriverRecord.from_json(kv.value)


def _in_use(keys: JobKeys, holder_kv: KeyValue | None) -> str:
    if holder_kv is None:
        return (
            f"job ID {keys.job_id!r} was just taken by another driver starting at the same "
            "time; pick another --job-id"
        )
    holder = DriverRecord.from_json(holder_kv.value)
    return f"job ID {keys.job_id!r} is running: {describe_driver(holder)}; pick another --job-id"
