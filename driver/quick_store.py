"""A client of the job's store whose calls give up within seconds (``quick_store``), for
what must not wait out an outage: the store's health probe, the cleanup at the end, a
``--join`` node's first look at its job. It stands apart from the job's wiring so that
a joining node (``driver.join``) and the job (``driver.job``) both take it from below."""

from __future__ import annotations

from rendezvous import open_store
from rendezvous.store import KVStore, StoreSettings

QUICK_STORE = StoreSettings(request_timeout=2.0, retry_deadline=4.0, connect_timeout=2.0)
"""A call of a ``quick_store`` client gives up after about this long (an attempt of
``request_timeout``, retried until ``retry_deadline``)."""


def quick_store(url: str, secret: str) -> KVStore:
    """Another client of the job's store whose calls give up within seconds (see
    ``QUICK_STORE``); it does no I/O until used.

    Raises:
        RendezvousConfigError: the URL is malformed.
    """
    return open_store(url, secret, QUICK_STORE, check=False)
