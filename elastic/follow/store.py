"""The ``"store"`` round feed: the worker is the store's client for its own membership.

1. it registers ``WorkerInfo`` under a lease of its own at ``/elastic/<job>/workers/<id>``
   (the lease ends the registration if the worker dies), after
2. a watch of the round's head (``JobKeys.plan_head``, not a poll per step) that reads
   this host's part of every newer round once (``elastic.rounds.RoundReader``) and hands
   it to ``on_round``.

A watch that ends for good (the store away too long, history compacted) is opened again
from the current round; a registration whose lease lapsed is written again, and a worker
that cannot for ``round_timeout`` is cut off from a job that would itself have given up
by then (``cut_off``).
"""

from __future__ import annotations

import logging
import threading

from elastic.follow.base import FeedHooks, FeedSettings
from elastic.rounds import RoundReader
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.retry import Backoff
from rendezvous.schema.workers import WorkerInfo
from rendezvous.store import PUT, KVStore, Lease, Watch

log = logging.getLogger(__name__)


class StoreFeed:
    """A ``RoundFeed`` through ``store`` directly (see the module docstring)."""

    def __init__(
        self,
        settings: FeedSettings,
        store: KVStore,
        keys: JobKeys,
        rounds: RoundReader,
        hooks: FeedHooks,
    ):
        self._settings = settings
        self._store = store
        self._keys = keys
        self._rounds = rounds
        self._on_round = hooks.on_round
        self._newest = hooks.newest
        self._closed = hooks.closed
        self._cut_off = hooks.cut_off
        self._info: WorkerInfo | None = None
        self._lease: Lease | None = None
        self._watch: Watch | None = None

    @property
    def lease_id(self) -> int:
        lease = self._lease
        return lease.id if lease is not None else 0

    def start(self, info: WorkerInfo) -> None:
        """Raises:
        RendezvousError: the store cannot be used."""
        self._info = info
        self._watch = self._open_round_watch()
        threading.Thread(target=self._follow_rounds, name="elastic-rounds", daemon=True).start()
        self._register()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._lease is not None:
            # Stop refreshing but do not revoke: a registration vanishing while the process
            # still runs looks like a hung worker and would make the driver re-form the
            # round. The driver removes it when it sees the process exit; the lease ends
            # it anyway if the driver is gone.
            self._lease.stop_keep_alive()

    # ---- rounds ----
    def _open_round_watch(self) -> Watch:
        """Read the current round, then watch the round head from just after that read.

        Raises:
            RendezvousError: the store cannot be used."""
        views, watch = self._rounds.read_and_watch()
        for view in views:
            self._on_round(view)
        return watch

    def _follow_rounds(self) -> None:
        while not self._closed.is_set():
            watch = self._watch
            if watch is None:
                return
            try:
                event = watch.get(timeout=1.0)
            except RendezvousError as exc:
                # A worker that stopped following rounds would hang its next round, so
                # start over from the current plan.
                log.warning("round watch ended (%s); following rounds again", exc)
                self._watch = self._reopen_round_watch()
                continue
            if event is not None and event.type == PUT and event.key == self._rounds.key:
                view = self._rounds.view(event.value, self._newest())
                if view is not None:
                    self._on_round(view)

    def _reopen_round_watch(self) -> Watch | None:
        """Watch rounds again, trying until it works or the worker shuts down (then the
        old watch is returned: the loop that asked stops anyway)."""
        backoff = Backoff(None, initial=1.0, cap=1.0, stop=self._closed)
        while not self._closed.is_set():
            try:
                return self._open_round_watch()
            except RendezvousError as exc:
                log.warning("cannot watch rounds yet: %s", exc)
            if not backoff.pause():
                break
        return self._watch

    # ---- the registration ----
    def _register(self) -> None:
        assert self._info is not None
        lease = self._store.grant_lease(self._settings.lease_ttl)
        self._store.put(self._keys.worker(self._settings.worker_id), self._info.to_json(), lease)
        lease.keep_alive(on_lost=self._on_lease_lost)
        self._lease = lease

    def _on_lease_lost(self, exc: Exception) -> None:
        """Our registration vanished (the store was away longer than the TTL): register
        again. A worker that cannot for ``round_timeout`` (the job's --elastic-timeout) is
        cut off from a job that would itself have given up by then: it ends itself, as an
        orphan does, rather than linger on a host nobody reaches."""
        if self._closed.is_set():
            return
        log.warning("worker registration lease lost (%s); registering again", exc)
        timeout = self._settings.round_timeout
        backoff = Backoff.within(timeout, initial=0.5, cap=0.5, stop=self._closed)
        while True:
            try:
                self._register()
                return
            except RendezvousError as err:
                log.warning("registering again failed: %s", err)
            if not backoff.pause():
                if not self._closed.is_set():
                    log.error("cut off from the job's store for %.0fs: stopping", timeout)
                    self._cut_off()
                return
