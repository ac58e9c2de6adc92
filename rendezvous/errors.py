"""The project's exception hierarchy root and the rendezvous store's typed errors.

``rendezvous`` is the lowest layer, so the root ``ElasticError`` lives here and
``elastic`` re-exports it: ``elastic.RendezvousError`` is then both an
``ElasticError`` and catchable by code that only knows the store.

Every error class registers itself by name so that a server can send a typed
error over the wire and the client raises the same class (see ``rendezvous.net.rpc``).
"""

from __future__ import annotations

_REGISTRY: dict[str, type[ElasticError]] = {}


class ElasticError(Exception):
    """Base of every error this project raises on purpose."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _REGISTRY[cls.__name__] = cls


def error_class(name: str) -> type[ElasticError] | None:
    """The registered error class called ``name``, or None."""
    return _REGISTRY.get(name)


class RendezvousError(ElasticError):
    """Any failure of the rendezvous store or of the round protocol on top of it."""


class RendezvousConnectionError(RendezvousError):
    """The store could not be reached, or did not answer before the deadline."""


class NotSentError(RendezvousConnectionError):
    """The request never reached a server (no connection): repeating it is safe, even for a
    transaction, unlike a request that timed out after it was sent."""


class StaleIncarnationError(NotSentError):
    """The server refused the call's proof of the secret as made for another incarnation
    of it: the process at that address restarted (or another serves there) since the
    caller learnt which process it is. Nothing of the call ran, so repeating it is
    safe, even for a transaction, once the caller has the server's incarnation again
    (from its record in the store, or asked of the server)."""


class RendezvousAuthError(RendezvousError):
    """The store (or a peer) refused the request: missing or wrong job secret."""


class StoreLoginRefused(RendezvousAuthError):
    """The store refused its own login (etcd's user and password): a setting that does
    not hold, which no retry mends."""


class RendezvousConfigError(RendezvousError, ValueError):
    """A malformed store URL or an unusable setting."""


class ValueTooLargeError(RendezvousError, ValueError):
    """A value above the store's size limit was refused before it was sent."""


class LeaseNotFoundError(RendezvousError):
    """The lease does not exist (it expired or was revoked)."""


class WatchCompactedError(RendezvousError):
    """A watch asked for history the store no longer keeps."""


class RendezvousClosedError(RendezvousError):
    """The client was closed; no further calls are possible."""


_REGISTRY["ElasticError"] = ElasticError
