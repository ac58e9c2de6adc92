"""The rendezvous KV store: one interface (``KVStore``) and three backends
(``rendezvous.backends``), two of them chosen by URL.

    store = open_store("etcd://10.0.0.5:2379,10.0.0.6:2379", secret)
    store = open_store("etcds://10.0.0.5:2379", secret)  # etcd over TLS
    store = open_store("embedded://127.0.0.1:40123", secret)

``etcd`` and ``embedded`` register by scheme in ``BACKENDS``; each is a ``KVStore``
subclass built from ``(StoreURL, secret, StoreSettings)``. The third, ``memory``, is
the embedded server's state (an in-memory etcd v3 model), with no URL of its own. The
records stored under the job's keys are ``rendezvous.schema``.

Importing this package changes no environment variable: gRPC's settings are made
where gRPC is loaded (``rendezvous.net.grpc_runtime``), when a backend is chosen.
"""

from __future__ import annotations

import os

from rendezvous.errors import (
    ElasticError,
    RendezvousConfigError,
    RendezvousConnectionError,
    RendezvousError,
)
from rendezvous.net.url import StoreURL, parse_store_url
from rendezvous.signing import RecordSigner
from rendezvous.store import (
    Compare,
    Delete,
    Event,
    KeyValue,
    KVStore,
    Lease,
    Put,
    StoreSettings,
    TxnResult,
    Watch,
)


def _embedded(url: StoreURL, secret: str | None, settings: StoreSettings) -> KVStore:
    from rendezvous.backends.embedded import EmbeddedStore

    if not url.endpoints:
        raise RendezvousConfigError(
            "the embedded store's address is not known here: "
            "'embedded' is for elastic-run; workers get embedded://HOST:PORT"
        )
    if not secret:
        raise RendezvousConfigError(
            "the embedded store needs the job secret (ELASTIC_JOB_SECRET is not set)"
        )
    return EmbeddedStore(str(url.endpoints[0]), secret, settings)


def _etcd(url: StoreURL, secret: str | None, settings: StoreSettings) -> KVStore:
    from rendezvous.backends.etcd import EtcdCredentials, EtcdStore

    return EtcdStore(url.endpoints, settings, EtcdCredentials.from_env(os.environ, tls=url.tls))


BACKENDS = {"embedded": _embedded, "etcd": _etcd}


def open_store(
    url: str, secret: str | None = None, settings: StoreSettings | None = None, check: bool = True
) -> KVStore:
    """A client of the store at ``url``; with ``secret``, one that signs the records it
    writes and ignores those it reads without the job's signature.

    With ``check``, one read proves the store answers (and accepts the secret) within
    ``settings.connect_timeout``. Raises RendezvousConfigError (bad URL),
    RendezvousAuthError (secret refused) or RendezvousConnectionError (unreachable)."""
    settings = settings or StoreSettings()
    parsed = parse_store_url(url)
    store = BACKENDS[parsed.scheme](parsed, secret, settings)
    if secret:
        # What the job writes carries its signature, and what does not is ignored
        # (``rendezvous.signing``): on etcd, anyone who reaches the store can write.
        store.signer = RecordSigner(secret)
    if check:
        from dataclasses import replace

        probe = replace(
            settings,
            retry_deadline=settings.connect_timeout,
            request_timeout=min(settings.request_timeout, settings.connect_timeout),
        )
        saved, store.settings = store.settings, probe
        try:
            store.revision()
        except RendezvousConnectionError as exc:
            store.close()
            raise RendezvousConnectionError(
                f"cannot reach the store at {parsed} within {settings.connect_timeout:.0f}s: {exc}"
            ) from None
        except BaseException:
            store.close()
            raise
        finally:
            store.settings = saved
    return store


__all__ = [
    "open_store",
    "parse_store_url",
    "KVStore",
    "StoreSettings",
    "KeyValue",
    "Event",
    "Compare",
    "Put",
    "Delete",
    "TxnResult",
    "Lease",
    "Watch",
    "BACKENDS",
    "ElasticError",
    "RendezvousError",
    "RendezvousConfigError",
    "RendezvousConnectionError",
]
