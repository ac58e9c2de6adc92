"""What a job runs beside its workers, started in order and stopped in reverse.

``JobServices.open`` opens the store the job's processes meet in (the driver's embedded
server, or an etcd client), claims the job id (``driver.lead.claim``), says ``job_started``,
tells the workers how many ps shards there are, and starts the feeds that follow the
store and the store's health probe (``driver.job.feeds``). ``start_shards`` and
``start_chaos`` start the ps shards (``driver.ps.supervisor``) and the chaos
(``driver.job.chaos``). At the end ``stop`` stops the shards and the chaos, and ``close``
releases the job id, deletes the job's keys and closes the store.

Apart from the main loop (``driver.job.loop``) because none of it is a decision: this is the
job's setting, up and down. It is given what it uses (the config, the job's keys and
secret, the launcher, the event sink, the clock, a ``post`` callback to the loop and
the event that ends the feeds), never the job.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from collections.abc import Mapping, Sequence
from typing import Callable

from driver import events as ev
from driver.config import JobConfig
from driver.errors import JobFailed, JobStopped
from driver.hosts.slots import HostSlots
from driver.job import feeds
from driver.job import messages as msg
from driver.job.chaos import ChaosMonkey
from driver.job.store_trouble import StoreTrouble
from driver.job.wiring import (
    driver_address,
    job_env,
    names_are_labels,
    open_job_store,
    quick_store,
    shard_command_for,
    shard_commands,
    worker_bind_host,
)
from driver.join.ended import JobOutcome, record_outcome
from driver.join.shape import check_shape, shape_bytes
from driver.launch.base import Launcher
from driver.launch.process import STOP_GRACE, WorkerProcess
from driver.lead.claim import DriverClaim, check_secret, new_record
from driver.lead.terms import ClaimAction, describe_leader, fence
from driver.ps.shard_hosts import ShardPlacement
from driver.ps.supervisor import PSSupervisor
from driver.threads import spawn
from rendezvous.backends.embedded import EmbeddedServer
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.plan import DriverRecord, PSConfigRecord
from rendezvous.store import Delete, KeyValue, KVStore, Put

log = logging.getLogger(__name__)


class JobServices:
    """The store, the claim on the job id, the feeds, the ps shards and the chaos of one
    job. ``all_local``: every process of the job runs on this machine (everything then
    binds and advertises loopback). ``stop`` is set when the job ends: the feed threads
    end with it."""

    def __init__(
        self,
        config: JobConfig,
        keys: JobKeys,
        secret: str,
        *,
        all_local: bool,
        launcher: Launcher,
        events: ev.EventSink,
        clock: Callable[[], float],
        post: Callable[[msg.Message], None],
        stop: threading.Event,
        usable_hosts: Callable[[], Sequence[str]] = tuple,
    ):
        self._config = config
        self._keys = keys
        self._secret = secret
        self._all_local = all_local
        self._launcher = launcher
        self._events = events
        self._clock = clock
        self._post = post
        self._stop = stop
        self._usable_hosts = usable_hosts
        self._signalled: list[int] = []  # SIGINT/SIGTERM received (``interrupt``)
        self._wake = threading.Event()  # a signal, or the ps shards' start is over
        self._interrupted = threading.Event()  # SIGINT/SIGTERM: a standby stops waiting
        self._server: EmbeddedServer | None = None
        self._claim: DriverClaim | None = None
        self._probe: KVStore | None = None  # the store's health probe's own client
        self.store_trouble = StoreTrouble()  # what the probe saw: lapses it explains
        self._ps: PSSupervisor | None = None
        self.chaos: ChaosMonkey | None = None
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
        cfg = self._config
        self.advertised_host = "127.0.0.1" if self._all_local else driver_address(cfg, hosts)
        self._server, store, self.store_url = open_job_store(
            cfg, self._secret, self._all_local, self.advertised_host
        )
        self.store = store
        # Before anything is read: with another secret than the job's, every record of
        # it would look forged, and a live job stale (one line naming the variable).
        check_secret(store, self._keys, self._secret, cfg.standby)
        # Refused (JobIdInUseError) while another driver leads a job of this id, unless
        # a standby: then it waits here until that driver is gone.
        self._claim = claim = DriverClaim.take(
            store,
            self._keys,
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
            self.snapshot, revision = store.get_prefix(self._keys.prefix)
        else:
            # Before any worker starts: a ps client of a job without shards fails at once.
            ps_config = PSConfigRecord(cfg.num_ps, cfg.ps_mode).to_json()
            shape = [Put(self._keys.shape, shape_bytes(cfg))] if cfg.join is not None else []
            revision = self.steer([Put(self._keys.ps_config, ps_config), *shape])
        feeds.follow_workers_and_failures(
            store,
            self._keys,
            self._post,
            self._stop,
            cfg.elastic_timeout,
            self._clock,
            revision=revision,
        )
        self._probe = quick_store(self.store_url, self._secret)
        feeds.probe_store(self._probe, self._events.emit, self._stop, trouble=self.store_trouble)

    def _standing_by(self, leader: DriverRecord) -> None:
        self._agree()
        self._events.emit(ev.StandingBy(self._config.job_id, describe_leader(leader), leader.term))

    def _agree(self) -> None:
        """Join mode: this node may wait on or lead the job only with the job's shape.

        Raises:
            UsageError: it differs (one line naming how).
        """
        if self._config.join is not None and self.store is not None:
            stored = self.store.get(self._keys.shape)
            check_shape(self._config, stored.value if stored is not None else None)

    @property
    def claim(self) -> DriverClaim:
        """The lead of the job (after ``open``).

        Raises:
            JobFailed: the store is not open.
        """
        if self._claim is None:
            raise JobFailed("the rendezvous store is not open")
        return self._claim

    def steer(self, ops: Sequence[Put | Delete]) -> int:
        """Write ``ops`` fenced on this driver's lead (``DriverClaim.steer``).

        Raises:
            LeadershipLost: another driver leads.
            RendezvousError: the store cannot be used.
        """
        return self.claim.steer(ops)

    def steer_unless(self, key: str, ops: Sequence[Put | Delete]) -> int | None:
        """``steer`` while ``key`` does not exist; None (nothing written) when it does.

        Raises:
            LeadershipLost: another driver leads.
            RendezvousError: the store cannot be used.
        """
        return self.claim.steer_unless(key, ops)

    def leader_term(self) -> int:
        """The term of this driver's leadership (the claim's record), stamped on what
        it writes for the agents."""
        return self._claim.record.term if self._claim is not None else 1

    def interrupt(self, signum: int) -> None:
        """SIGINT or SIGTERM came (thread-safe): a wait for the ps shards, or a standby's
        wait for its leader, ends at once."""
        self._signalled.append(signum)
        self._interrupted.set()
        self._wake.set()

    def start_shards(self) -> None:
        """Start ``--num-ps`` ps shards (if any) and wait until they serve (up to
        ``--start-timeout``) in a helper thread, so that SIGINT or SIGTERM
        (``interrupt``) ends the wait at once: the loop that handles signals does not
        run yet.

        Raises:
            JobFailed: the shards did not come up.
            JobStopped: SIGINT or SIGTERM came first.
            LauncherError: a shard cannot be started.
        """
        cfg = self._config
        if not cfg.num_ps:
            return
        self._ps = supervisor = self._supervisor()
        ended: list[BaseException | None] = []

        def start() -> None:
            try:
                supervisor.start()
                ended.append(None)
            except BaseException as exc:  # noqa: BLE001  (handed to the waiting thread)
                ended.append(exc)
            finally:
                self._wake.set()

        spawn("ps-start", start)
        # The supervisor has its own deadline; this one only guards against a bug there.
        self._wake.wait(cfg.start_timeout + 2 * STOP_GRACE)
        if self._signalled:
            raise JobStopped(
                f"stopped by {signal.Signals(self._signalled[0]).name} while the ps shards "
                "started; all workers were stopped",
                self._signalled[0],
            )
        if not ended:
            raise JobFailed(f"ps shards not ready within {cfg.start_timeout:g}s")
        if ended[0] is not None:
            raise ended[0]

    def adopt_shards(self, handed_over: Mapping[str, WorkerProcess]) -> None:
        """Supervise the ps shards a driver that led the job before started (those among
        ``handed_over``, the processes its agents' records gave, labelled ``psI``, their
        backups ``psI-backup``), and start the missing ones.

        Raises:
            LauncherError: a missing shard cannot be started.
        """
        if not self._config.num_ps:
            return
        running: dict[int, WorkerProcess] = {}
        backups: dict[int, WorkerProcess] = {}
        for p in handed_over.values():
            label = p.spec.label
            index = label[2:].removesuffix("-backup")
            if label.startswith("ps") and index.isdigit():
                (backups if label.endswith("-backup") else running)[int(index)] = p
        self._ps = self._supervisor()
        self._ps.adopt(running, backups)

    def _supervisor(self) -> PSSupervisor:
        """The ps supervisor of this job (``--ps-placement`` spread: on the usable hosts)."""
        cfg = self._config
        bind = "127.0.0.1" if self._all_local else self.advertised_host
        placement = None
        if cfg.ps_placement == "spread":

            def command(index: int, host: str) -> tuple[str, ...]:
                labels = names_are_labels(cfg)
                on_host = worker_bind_host(host, self._all_local, self.advertised_host, labels)
                return shard_command_for(cfg, index, on_host or host)

            placement = ShardPlacement(command, self._usable_hosts)
        return PSSupervisor(
            shard_commands(cfg, bind),
            job_env(cfg, self._secret, self.store_url),
            store=self.require_store(),
            keys=self._keys,
            launcher=self._launcher,
            events=self._events,
            on_fatal=lambda reason: self._post(msg.Fatal(reason)),
            ready_timeout=cfg.start_timeout,
            store_patience=cfg.elastic_timeout,
            clock=self._clock,
            placement=placement,
            replicas=cfg.ps_replicas,
            checkpoints=bool(cfg.ps_checkpoint_dir),
        )

    def start_chaos(self) -> None:
        """Start ``--chaos-kill-interval``'s timer (if set): it posts ``ChaosTick``."""
        cfg = self._config
        if cfg.chaos_kill_interval:
            tick = functools.partial(self._post, msg.ChaosTick())
            self.chaos = ChaosMonkey(cfg.chaos_kill_interval, cfg.chaos_max_kills, tick)
            self.chaos.start()

    def read_registration_later(self, worker_id: str, delay: float) -> None:
        """In ``delay`` seconds (unless the job ends first), read worker ``worker_id``'s
        registration and post it (``msg.RegistrationRead``; its value None when it is
        gone, and when the store cannot be read: ``readable`` False)."""

        def read() -> None:
            if self._stop.wait(delay) or self.store is None:
                return
            try:
                kv, readable = self.store.get(self._keys.worker(worker_id)), True
            except RendezvousError:
                kv, readable = None, False
            self._post(msg.RegistrationRead(worker_id, kv, readable))

        spawn(f"registration-{worker_id}", read)

    def require_store(self) -> KVStore:
        """The store's client.

        Raises:
            JobFailed: the store is not open.
        """
        if self.store is None:
            raise JobFailed("the rendezvous store is not open")
        return self.store

    def delete_quietly(self, key: str) -> None:
        """Delete ``key`` (a prefix when it ends in ``/``), fenced on the lead; a failure
        of the store is only logged.

        Raises:
            LeadershipLost: another driver leads.
        """
        try:
            self.steer([Delete(key, prefix=key.endswith("/"))])
        except RendezvousError as exc:
            log.debug("could not delete %s: %s", key, exc)

    def has_key(self, key: str) -> bool:
        """Whether ``key`` exists (False when the store cannot say: a failure is logged)."""
        return self.value(key) is not None

    def value(self, key: str) -> bytes | None:
        """What ``key`` holds (None when it does not exist, or when the store cannot
        say: a failure is logged)."""
        try:
            kv = self.require_store().get(key)
        except RendezvousError as exc:
            log.warning("could not read %s: %s", key, exc)
            return None
        return kv.value if kv is not None else None

    @property
    def leads(self) -> bool:
        """This driver leads the job (or never got to lead it): its end is the job's."""
        return self._claim is None or self._claim.lost is None

    def stop(self) -> None:
        """Stop the chaos and the ps shards (the workers are the caller's); a driver that
        lost the lead leaves the shards to the new leader."""
        if self.chaos is not None:
            self.chaos.stop()
        self.stop_shards()

    def stop_shards(self) -> str | None:
        """Stop the ps shards, when there are and this driver leads the job (again: the
        first call's answer): why their last state is in no checkpoint
        (``PSSupervisor.stop``), None when it is or there is nothing to say."""
        if self._ps is None or not self.leads:
            return None
        return self._ps.stop()

    def close(self, outcome: JobOutcome | None = None) -> None:
        """Delete the job's keys and end the driver's lease (when this driver still
        leads the job: in join mode, after keeping the job's ``outcome``, when it has
        one: ``driver.join.ended``); close the store's clients and stop the embedded
        server."""
        if self._claim is not None and self._claim.lost is None:
            self._release_claim(self._claim, outcome if self._config.join else None)
        for client in (self._probe, self.store):
            if client is not None:
                client.close()
        if self._server is not None:
            self._server.stop()

    def _release_claim(self, claim: DriverClaim, outcome: JobOutcome | None) -> None:
        """Leave nothing in the store but the ``outcome`` (when given): the job's keys
        and the driver's lease go, through a client whose calls give up within seconds
        (the job is over; an unreachable store must not hold its end)."""
        cleaner = quick_store(self.store_url, self._secret)
        try:
            if outcome is not None:
                record_outcome(cleaner, self._keys, outcome, fence(self._keys, claim.record))
            claim.release(cleaner)
        except RendezvousError as exc:
            log.warning("could not delete the job's keys from the store: %s", exc)
        finally:
            cleaner.close()
