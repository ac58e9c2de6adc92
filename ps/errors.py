"""Typed errors of the parameter-server client and shards.

Every class registers by name (``rendezvous.errors.ElasticError``), so a shard that
raises one makes the client raise the same class (``rendezvous.net.rpc`` transport).
Names start with ``PS`` to stay unique in that registry.
"""

from __future__ import annotations

from elastic.errors import HostsUpdatedInterrupt
from rendezvous.errors import ElasticError, RendezvousConnectionError
from rendezvous.net.rpc_wire import MalformedRequest


class PSError(ElasticError):
    """Base of every parameter-server error."""


class PSConfigError(PSError, ValueError):
    """A bad setting or argument, or a job without ps shards (``connect()``)."""


class PSUnavailableError(PSError):
    """A shard did not answer (down, restarting, restoring) within the client's
    retry deadline. Below the deadline the client retries: a worker sees a pause."""


class PSNotReadyError(PSError):
    """Sent by a shard that is restoring or paused past a request's patience; retryable."""


class PSWrongShardError(PSError):
    """The address reached a different shard (a stale address after a restart); retryable."""


class PSTransferError(PSError):
    """A staged upload or download is unknown or incomplete (the shard restarted or the
    staging expired); the client repeats the whole operation."""


class PSUninitializedError(PSError, LookupError):
    """A variable is not on the shard: never created, or the shard restarted without a
    checkpoint. A client that called ``init`` re-creates its variables and retries."""


class PSShapeError(PSError, ValueError):
    """A tensor's name, shape or dtype does not match the variable it is meant for."""


class PSProtocolError(PSError):
    """A request that contradicts the shard's state (e.g. two sizes for one round)."""


class PSHeaderError(PSProtocolError, MalformedRequest):
    """A header that does not parse: a missing field, or a value of the wrong type (the
    message names the record and the field). A shard answers INVALID_ARGUMENT with it
    and logs one rate-limited line, never a traceback."""


class PSTimeoutError(PSError, TimeoutError):
    """A sync-mode step was not completed by every member within ``sync_timeout``."""


class PSRoundChangedError(PSError, HostsUpdatedInterrupt):
    """Sync mode: a newer round superseded the one this push belonged to, so its step was
    dropped. ``@elastic.run`` treats it as ``HostsUpdatedInterrupt``: re-form, then redo
    the step (pull, compute, push)."""

    def __init__(self, message: str = "ps round changed", skip_sync: bool = False):
        super().__init__(message, skip_sync)


class PSReplicaError(PSError):
    """A mirrored update was refused: the receiver is not (or no longer) the sender's
    backup (it was promoted, or a newer copy replaced it), or its copy diverged. The
    sending primary then drops that backup, or learns that it was replaced."""


class PSCheckpointError(PSError):
    """A checkpoint file or manifest is missing, truncated or fails its checksum."""


class PSCheckpointWriteError(PSError):
    """A checkpoint file or manifest could not be written (the message names the file
    and the system's error). The attempt is abandoned and the next one tries again."""


class PSNoSpaceError(PSCheckpointWriteError):
    """The checkpoint directory's disk (or the user's quota there) is full."""


# Failures that mean "not there yet / not this process": try again (re-reading the address).
RETRYABLE = (RendezvousConnectionError, PSNotReadyError, PSWrongShardError, PSTransferError)
