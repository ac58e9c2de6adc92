"""The threads that feed the job's main loop: each posts ``driver.job.messages`` to it
(the store's probe alone reports by itself, see ``probe_store``).

* ``follow_workers_and_failures``: four store watches, registrations
  (``RegistryChanged``, ``RegistryResync``), failure reports (``FailureReport``,
  ``FailureResync``), rank 0's progress (``ProgressReported``) and the workers'
  snapshots (``SnapshotReported``), kept alive through
  outages by ``rendezvous.watch.follow_prefix``; a store away for longer than
  ``--elastic-timeout`` posts ``StoreLost``;
* ``probe_store``: one read every ``PROBE_INTERVAL`` through a client whose calls give
  up within seconds, and the events ``store_health`` says of it, emitted from the
  probe's thread (the watches retry in silence; this is how the driver knows); an
  etcd that stalls keeps its watches open, so the probe also posts ``StoreLost`` for an
  outage longer than ``--elastic-timeout`` (``store_outage_over``);
* ``poll_discovery``: the discovery script every ``--discovery-interval`` (``HostsFound``
  or ``DiscoveryFailed``);
* ``posting_signals``: SIGINT and SIGTERM as ``SignalReceived``, SIGUSR1 as ``StacksAsked``.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from driver.errors import DiscoveryError
from driver.events import Event
from driver.hosts.discovery import HostDiscovery
from driver.job.messages import (
    DiscoveryFailed,
    FailureReport,
    FailureResync,
    HostPreempted,
    HostsFound,
    Message,
    ProgressReported,
    RegistryChanged,
    RegistryResync,
    SignalReceived,
    SnapshotReported,
    StacksAsked,
    StoreLost,
    TrainingFinished,
)
from driver.job.store_trouble import StoreTrouble
from driver.policy.decisions import StoreHealth
from driver.policy.reports import store_health, store_outage_over
from driver.threads import spawn
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.signals import relay_signals
from rendezvous.store import PUT, KeyValue, KVStore
from rendezvous.store import Event as StoreEvent
from rendezvous.watch import follow_prefix

Post = Callable[[Message], None]

PROBE_INTERVAL = 1.0
"""Seconds between two looks at the store's health."""


def follow_workers_and_failures(
    store: KVStore,
    keys: JobKeys,
    post: Post,
    stop: threading.Event,
    patience: float,
    clock: Callable[[], float] = time.monotonic,
    revision: int | None = None,
) -> None:
    """Watch the registrations, the failure reports, the progress record and what the
    workers' snapshots say after ``revision`` (default: the store's current one), each
    in a daemon thread, until ``stop``.

    Raises:
        RendezvousError: the store's revision cannot be read or a watch cannot start.
    """
    if revision is None:
        revision = store.revision()

    def lost(exc: Exception) -> None:
        post(StoreLost(f"{exc} (for more than --elastic-timeout {patience:g}s)"))

    def follow(
        prefix: str,
        on_event: Callable[[StoreEvent], object],
        on_resync: Callable[[Sequence[KeyValue]], object],
        fresh: bool = False,
    ) -> None:
        watch = None if fresh else store.watch_prefix(prefix, start_revision=revision + 1)
        spawn(
            f"watch-{prefix}",
            follow_prefix,
            store,
            prefix,
            watch,
            on_event=on_event,
            on_resync=on_resync,
            on_lost=lost,
            stop=stop,
            patience=patience,
            clock=clock,
        )

    follow(keys.workers, lambda e: post(RegistryChanged(e)), lambda kvs: post(RegistryResync(kvs)))
    # The reports from a fresh read: a driver that just took the lead acts on those made
    # while the job had none (a silent peer of the host its predecessor was on).
    follow(
        keys.failures,
        lambda e: post(FailureReport.from_event(e)),
        lambda kvs: post(FailureResync(kvs)),
        fresh=True,
    )

    def records(prefix: str, message: Callable[[KeyValue], Message]) -> None:
        """Follow records each told as one message (a resync re-reads the newest)."""

        def each(kvs: Sequence[KeyValue]) -> None:
            for kv in kvs:
                post(message(kv))

        follow(prefix, lambda e: each([e.kv]) if e.type == PUT else None, each)

    records(keys.progress, lambda kv: ProgressReported(kv.value))
    records(keys.training_finished, lambda kv: TrainingFinished(kv.value))
    records(keys.snapshots, lambda kv: SnapshotReported.from_kv(keys, kv))
    records(keys.preemptions, lambda kv: HostPreempted(kv.value.decode(errors="replace")))


@dataclass(frozen=True)
class StoreProbe:
    """What the store's probe tells, and to whom: ``emit`` what it says of the store
    (the events), ``trouble`` each look (``driver.job.store_trouble``), ``lost`` the
    outage that outlasted ``bound`` seconds (``--elastic-timeout``: the job ends)."""

    emit: Callable[[Event], object]
    trouble: StoreTrouble | None = None
    lost: Callable[[str], object] | None = None
    bound: float = float("inf")


def probe_store(
    client: KVStore,
    tells: StoreProbe,
    stop: threading.Event,
    interval: float = PROBE_INTERVAL,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Read the store's revision every ``interval`` seconds through ``client`` (its calls
    must give up within seconds) in a daemon thread until ``stop``, and tell what
    ``driver.policy.reports.store_health`` says of it (``tells``). The thread says it
    itself, not through the loop: the loop may be the one waiting for the store. An
    outage past ``tells.bound`` is told once, and the probe ends. ``client`` is the
    caller's."""
    trouble = tells.trouble

    def probe() -> None:
        health = StoreHealth()
        while not stop.wait(interval):
            if trouble is not None:
                trouble.asking()
            try:
                client.revision()
                answered, error = True, ""
            except RendezvousError as exc:
                answered, error = False, str(exc)
            if trouble is not None:
                trouble.answered(answered)
            if stop.is_set():
                return
            now = clock()
            health, said = store_health(health, answered, error, now)
            for event in said:
                tells.emit(event)
            over = store_outage_over(health, now, tells.bound)
            if over is not None and tells.lost is not None:
                tells.lost(over)
                return

    spawn("store-probe", probe)


def poll_discovery(
    discovery: HostDiscovery, interval: float, post: Post, stop: threading.Event
) -> None:
    """Run ``discovery`` every ``interval`` seconds in a daemon thread, until ``stop``."""

    def poll() -> None:
        while not stop.wait(interval):
            try:
                post(HostsFound(discovery.find_hosts()))
            except DiscoveryError as exc:
                post(DiscoveryFailed(str(exc)))

    spawn("discovery", poll)


@contextmanager
def posting_signals(post: Post) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM become ``SignalReceived`` messages handed to
    ``post`` (the loop then stops the job in order), and SIGUSR1 ``StacksAsked`` (the
    workers' stacks printed, nothing changed); the previous handlers come back
    after. A no-op outside the main thread, where Python cannot set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # (through a thread: ``post`` takes locks, which a handler must not: rendezvous.signals)
    restore = relay_signals(
        (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1),
        lambda s: post(StacksAsked() if s == signal.SIGUSR1 else SignalReceived(s)),
    )
    try:
        yield
    finally:
        restore()
