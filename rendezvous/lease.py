"""A lease granted by a store (``rendezvous.store.KVStore.grant_lease``), and the thread
that keeps it alive.

Why apart from the store: a lease needs of its store only its two lease calls
(``LeaseStore``), and what it decides alone is when a lease must be presumed gone: the
store says it expired, or stays unreachable for longer than the lease's TTL.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable, Protocol

from rendezvous.errors import LeaseNotFoundError, RendezvousClosedError, RendezvousError

log = logging.getLogger(__name__)


class LeaseStore(Protocol):
    """What a lease asks of its store."""

    def keepalive(self, lease_id: int, retry: bool = True) -> int:
        """Refresh the lease; returns the TTL (LeaseNotFoundError once it expired)."""
        ...

    def revoke(self, lease_id: int) -> None:
        """End the lease now."""
        ...


class Lease:
    """A lease granted by a store; keys put with ``lease=lease.id`` vanish when it ends."""

    def __init__(self, store: LeaseStore, lease_id: int, ttl: int):
        self.store = store
        self.id = lease_id
        self.ttl = ttl
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> int:
        """One keep-alive; returns the TTL granted. Raises LeaseNotFoundError once expired."""
        return self.store.keepalive(self.id)

    def keep_alive(
        self, on_lost: Callable[[Exception], None] | None = None, interval: float | None = None
    ) -> None:
        """Refresh in a daemon thread every ``interval`` (default TTL/3) until ``revoke``.

        ``on_lost`` is called once if the lease is found expired, or if the store stays
        unreachable for longer than the TTL (the lease must be presumed gone then)."""
        interval = interval or max(self.ttl / 3.0, 0.2)

        def loop():
            last_ok = time.monotonic()
            while not self._stop.wait(interval):
                try:
                    self.store.keepalive(self.id, retry=False)
                    last_ok = time.monotonic()
                except LeaseNotFoundError as exc:
                    if on_lost:
                        on_lost(exc)
                    return
                except RendezvousClosedError:
                    return
                except RendezvousError as exc:
                    if time.monotonic() - last_ok > self.ttl:
                        if on_lost:
                            on_lost(exc)
                        return
                    log.debug("lease %x keep-alive failed, retrying: %s", self.id, exc)

        self._thread = threading.Thread(target=loop, name=f"lease-{self.id:x}", daemon=True)
        self._thread.start()

    def stop_keep_alive(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def revoke(self) -> None:
        """Stop refreshing and end the lease now (its keys vanish). Idempotent."""
        self.stop_keep_alive()
        with contextlib.suppress(LeaseNotFoundError):
            self.store.revoke(self.id)
