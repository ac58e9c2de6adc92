"""What a ring communicator's failed setup breaks it with (pure): the error every
collective of it raises from then on."""

from __future__ import annotations

from elastic.errors import (
    CollectiveMismatchError,
    CommunicatorClosedError,
    PeerLostError,
    ShmUnavailableError,
    WorkerLostError,
)
from rendezvous.errors import RendezvousAuthError

#: what a failed setup raises as it is (PeerLostError, CommunicatorClosedError, ...)
TYPED_ERRORS = (WorkerLostError, RendezvousAuthError, ShmUnavailableError, CollectiveMismatchError)


def setup_break(err: BaseException) -> tuple[type, str, dict]:
    """A failed construction's break (the error's type, message and fields): a typed
    error as it is, else CommunicatorClosedError."""
    if isinstance(err, PeerLostError):
        return type(err), str(err), {"rank": err.rank, "direct": err.direct, "cause": err.cause}
    if isinstance(err, TYPED_ERRORS):
        return type(err), str(err), {}
    return CommunicatorClosedError, f"setup failed: {err!r}", {}
