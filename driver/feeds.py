"""The threads that feed the job's main loop: each only posts ``driver.messages`` to it.

* ``follow_workers_and_failures``: two store watches, registrations (``RegistryChanged``,
  ``RegistryResync``) and failure reports (``FailureReport``, ``FailureResync``), kept
  alive through outages by ``driver.watch.follow_prefix``; a store away for longer than
  ``--elastic-timeout`` posts ``StoreLost``;
* ``poll_discovery``: the discovery script every ``--discovery-interval`` (``HostsFound``
  or ``DiscoveryFailed``);
* ``posting_signals``: SIGINT and SIGTERM as ``SignalReceived``.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

from driver.discovery import HostDiscovery
from driver.errors import DiscoveryError
from driver.messages import (
    DiscoveryFailed,
    FailureReport,
    FailureResync,
    HostsFound,
    Message,
    RegistryChanged,
    RegistryResync,
    SignalReceived,
    StoreLost,
)
from driver.watch import follow_prefix
from rendezvous.keys import JobKeys
from rendezvous.store import KVStore

Post = Callable[[Message], None]


def _spawn(name: str, target: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    threading.Thread(target=target, args=args, kwargs=kwargs, name=name, daemon=True).start()


def follow_workers_and_failures(
    store: KVStore,
    keys: JobKeys,
    post: Post,
    stop: threading.Event,
    patience: float,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Watch the registrations and the failure reports from the store's current revision
    on, each in a daemon thread, until ``stop``.

    Raises:
        RendezvousError: the store's revision cannot be read or a watch cannot start.
    """
    revision = store.revision()

    def lost(exc: Exception) -> None:
        post(StoreLost(f"{exc} (for more than --elastic-timeout {patience:g}s)"))

    feeds = (
        (keys.workers, RegistryChanged, RegistryResync),
        (keys.failures, FailureReport, FailureResync),
    )
    for prefix, on_event, on_resync in feeds:
        watch = store.watch_prefix(prefix, start_revision=revision + 1)
        _spawn(
            f"watch-{prefix}",
            follow_prefix,
            store,
            prefix,
            watch,
            on_event=lambda e, m=on_event: post(m(e)),
            on_resync=lambda kvs, m=on_resync: post(m(list(kvs))),
            on_lost=lost,
            stop=stop,
            patience=patience,
            clock=clock,
        )


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

    _spawn("discovery", poll)


@contextmanager
def posting_signals(post: Post) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM become ``SignalReceived`` messages handed to
    ``post`` (the loop then stops the job in order); the previous handlers come back
    after. A no-op outside the main thread, where Python cannot set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, _frame: post(SignalReceived(signum)))
        yield
    finally:
        for old_sig, handler in previous.items():
            signal.signal(old_sig, handler)
