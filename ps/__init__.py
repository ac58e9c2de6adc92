"""Parameter servers: shards (``python -m ps.server``) and their client.

``elastic.ps.connect()`` builds a ``PSClient`` from the environment elastic-run gives
a worker. Importing this package is cheap (``import elastic`` does it); the client
and its dependencies load on first use.
"""

from __future__ import annotations

from ps.errors import (
    PSConfigError,
    PSError,
    PSRoundChangedError,
    PSShapeError,
    PSTimeoutError,
    PSUnavailableError,
    PSUninitializedError,
)


def connect(settings=None):
    """A ``PSClient`` of this job's shards (see ``ps.client.connect``).
    Raises PSConfigError when the job has no ps shards."""
    from ps.client import connect as _connect

    return _connect(settings)


def __getattr__(name):
    if name in ("PSClient", "ClientSettings"):
        from ps import client, settings

        return getattr(client if name == "PSClient" else settings, name)
    raise AttributeError(name)


__all__ = [
    "connect",
    "PSClient",
    "ClientSettings",
    "PSError",
    "PSConfigError",
    "PSUnavailableError",
    "PSUninitializedError",
    "PSShapeError",
    "PSRoundChangedError",
    "PSTimeoutError",
]
