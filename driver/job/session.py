"""The job's store session: the store its processes meet in, opened; the claim on the job
id, taken; the feeds that follow the store, started; and, at the end, all of it closed.

``StoreSession.open`` opens the store (the driver's embedded server, or an etcd client),
claims the job id (``driver.leadership.claim``), says ``job_started``, tells the workers how
many ps shards there are, and starts the feeds that follow the store and the store's
health probe (``driver.job.feeds``). ``close`` releases the job id, deletes the job's
keys and closes the store.

It also says what every process of the job is started with (``wiring``: the config, the
secret, the store URL) and what a worker on a host binds (``bind_host``): both depend on
where the store was opened. What is written through the claim lives in
``driver.job.fenced``; the ps shards in ``driver.job.shards``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Callable

from driver import events as ev
from driver.config import JobConfig
from driver.errors import JobFailed
from driver.hosts.slots import HostSlots
from driver.job import feeds
from driver.job import messages as msg
from driver.job.store_trouble import StoreTrouble
from driver.job.wiring import (
    JobWiring,
    driver_address,
    names_are_labels,
    open_job_store,
    worker_bind_host,
)
from driver.join.ended import JobOutcome, record_outcome
from driver.join.shape import check_shape, shape_bytes
from driver.leadership.claim import DriverClaim, check_secret, new_record
from driver.leadership.terms import ClaimAction, describe_leader, fence
from driver.quick_store import quick_store
from driver.threads import spawn
from rendezvous.backends.embedded import EmbeddedServer
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.schema.leader import DriverRecord
from rendezvous.schema.ps import PSConfigRecord
from rendezvous.store import KeyValue, KVStore, Put

log = logging.getLogger(__name__)


class StoreSession:
    """The store and the claim on the job id of one job (``config``, ``secret``).
    ``all_local``: every process of the job runs on this machine (everything then binds
    and advertises loopback). The feeds post to the loop (``post``) until ``stop`` is
    set; ``events`` hears ``job_started`` and the probe's findings; ``clock`` is the
    monotonic time the feeds see."""

    def __init__(
        self,
        config: JobConfig,
        secret: str,
        *,
        all_local: bool,
        events: ev.EventSink,
        clock: Callable[[], float],
        post: Callable[[msg.Message], None],
        stop: threading.Event,
    ):
        self.config = config
        self.keys = JobKeys(config.job_id)
        self.secret = secret
        self.all_local = all_local
        self._events = events
        self._clock = clock
        self._post = post
        self._stop = stop
        self._interrupted = threading.Event()  # SIGINT/SIGTERM: a standby stops waiting
        self._server: EmbeddedServer | None = None
        self._claim: DriverClaim | None = None
        self._probe: KVStore | None = None  # the store's health probe's own client
        self.store_trouble = StoreTrouble()  # what the probe saw: lapses it explains
        self.store: KVStore | None = None
        self.store_url = ""
        self.advertised_host = "127.0.0.1"  # how the hosts reach the driver (set by open)
        self.snapshot: list[KeyValue] = []  # the job's keys when an adopting driver took over

    def open(self, hosts: Sequence[HostSlots]) -> None:
        """Open the store, claim the job id, say ``job_started``, publish the ps config
        and follow the store. ``hosts``: the first discovery's, toward which the driver's
        address is chosen.

        Raises:
            AddressError: no usable address toward ``hosts``.
            RendezvousError: the store cannot be opened.
            JobIdInUseError: another driver leads a job of this id.
        """
        cfg = self.config
        self.advertised_host = "127.0.0.1" if self.all_local else driver_address(cfg, hosts)
        self._server, store, self.store_url = open_job_store(
            cfg, self.secret, self.all_local, self.advertised_host
        )
        self.store = store
        # Before anything is read: with another secret than the job's, every record of
        # it would look forged, and a live job stale (one line naming the variable).
        check_secret(store, self.keys, self.secret, cfg.standby)
        # Refused (JobIdInUseError) while another driver leads a job of this id, unless
        # a standby: then it waits here until that driver is gone.
        self._claim = claim = DriverClaim.take(
            store,
            self.keys,
            new_record,
            on_taken=lambda reason: self._post(msg.LeadLost(reason)),
            standby=cfg.standby,
            stop=self._interrupted,
            on_wait=self._standing_by,
            # (the driver's own embedded store has no standby; a joined node's has)
            beats=cfg.rendezvous.scheme == "etcd" or cfg.join is not None,
        )
        # First in the run's events (right after the store, whose URL it names): several
        # runs may append to one events file, and this line is where each begins.
        command = list(cfg.command)
        started = ev.JobStarted(cfg.job_id, self.store_url, cfg.np, cfg.min_np, cfg.max_np, command)
        self._events.emit(started)
        if claim.taken.action is ClaimAction.ADOPT:
            self._agree()  # (before anything of the job is touched)
            # What the job is now, read once; the feeds follow every change after it.
            self.snapshot, revision = store.get_prefix(self.keys.prefix)
        else:
            # Before any worker starts: a ps client of a job without shards fails at once.
            ps_config = PSConfigRecord(cfg.num_ps, cfg.ps_mode).to_json()
            shape = [Put(self.keys.shape, shape_bytes(cfg))] if cfg.join is not None else []
            revision = claim.steer([Put(self.keys.ps_config, ps_config), *shape])
        feeds.follow_workers_and_failures(
            store,
            self.keys,
            self._post,
            self._stop,
            cfg.elastic_timeout,
            self._clock,
            revision=revision,
        )
        self._probe = quick_store(self.store_url, self.secret)
        tells = feeds.StoreProbe(
            self._events.emit,
            self.store_trouble,
            lost=lambda reason: self._post(msg.StoreLost(reason)),
            bound=cfg.elastic_timeout,
        )
        feeds.probe_store(self._probe, tells, self._stop)

    def _standing_by(self, leader: DriverRecord) -> None:
        self._agree()
        self._events.emit(ev.StandingBy(self.config.job_id, describe_leader(leader), leader.term))

    def _agree(self) -> None:
        """Join mode: this node may wait on or lead the job only with the job's shape.

        Raises:
            UsageError: it differs (one line naming how).
        """
        if self.config.join is not None and self.store is not None:
            stored = self.store.get(self.keys.shape)
            check_shape(self.config, stored.value if stored is not None else None)

    def interrupt(self) -> None:
        """SIGINT or SIGTERM came (thread-safe): a standby's wait for its leader ends."""
        self._interrupted.set()

    @property
    def claim(self) -> DriverClaim:
        """The lead of the job (after ``open``).

        Raises:
            JobFailed: the store is not open.
        """
        if self._claim is None:
            raise JobFailed("the rendezvous store is not open")
        return self._claim

    @property
    def leads(self) -> bool:
        """This driver leads the job (or never got to lead it): its end is the job's."""
        return self._claim is None or self._claim.lost is None

    def require_store(self) -> KVStore:
        """The store's client.

        Raises:
            JobFailed: the store is not open.
        """
        if self.store is None:
            raise JobFailed("the rendezvous store is not open")
        return self.store

    @property
    def wiring(self) -> JobWiring:
        """What every process of the job is started with (its store: after ``open``)."""
        return JobWiring(self.config, self.secret, self.store_url)

    def bind_host(self, host: str) -> str:
        """What a worker on ``host`` binds its listener to and advertises
        (``driver.job.wiring.worker_bind_host``)."""
        labels = names_are_labels(self.config)
        return worker_bind_host(host, self.all_local, self.advertised_host, labels)

    def read_registration_later(self, worker_id: str, delay: float) -> None:
        """In ``delay`` seconds (unless the job ends first), read worker ``worker_id``'s
        registration and post it (``msg.RegistrationRead``; its value None when it is
        gone, and when the store cannot be read: ``readable`` False)."""

        def read() -> None:
            if self._stop.wait(delay) or self.store is None:
                return
            try:
                kv, readable = self.store.get(self.keys.worker(worker_id)), True
            except RendezvousError:
                kv, readable = None, False
            self._post(msg.RegistrationRead(worker_id, kv, readable))

        spawn(f"registration-{worker_id}", read)

    def close(self, outcome: JobOutcome | None = None, store_lost: bool = False) -> None:
        """Delete the job's keys and end the driver's lease (when this driver still
        leads the job: in join mode, after keeping the job's ``outcome``, when it has
        one: ``driver.join.ended``); close the store's clients and stop the embedded
        server. ``store_lost``: the store did not answer for longer than its bound, so
        nothing is asked of it (the lease lapses; the next driver of the id finds the
        keys stale and deletes them)."""
        if self._claim is not None and self._claim.lost is None and not store_lost:
            self._release_claim(self._claim, outcome if self.config.join else None)
        for client in (self._probe, self.store):
            if client is not None:
                client.close()
        if self._server is not None:
            self._server.stop()

    def _release_claim(self, claim: DriverClaim, outcome: JobOutcome | None) -> None:
        """Leave nothing in the store but the ``outcome`` (when given): the job's keys
        and the driver's lease go, through a client whose calls give up within seconds
        (the job is over; an unreachable store must not hold its end)."""
        cleaner = quick_store(self.store_url, self.secret)
        try:
            if outcome is not None:
                record_outcome(cleaner, self.keys, outcome, fence(self.keys, claim.record))
            claim.release(cleaner)
        except RendezvousError as exc:
            log.warning("could not delete the job's keys from the store: %s", exc)
        finally:
            cleaner.close()
