"""The worker API's exceptions (contract names: see docs/DESIGN.md), in one place: what a
training script may catch, whichever part of the worker raises it."""

from __future__ import annotations

import enum

from rendezvous.errors import ElasticError, RendezvousError


class HostsUpdatedInterrupt(ElasticError):
    """A newer round is pending: hosts were added or removed. Raised by ``State.commit()``
    and ``check_host_updates()``; ``@elastic.run`` re-forms without rolling back."""

    def __init__(self, message: str = "hosts updated", skip_sync: bool = False):
        super().__init__(message)
        self.skip_sync = skip_sync


class WorkerLostError(ElasticError):
    """A peer of the current round died or stopped answering, or the communicator was
    closed under a blocked call. ``@elastic.run`` restores the last commit and re-forms."""


class LossCause(enum.Enum):
    """Why a member of the round counts as lost (``PeerLostError.cause``), as a value:
    what the driver is told depends on it, never on the words of a message.

    ``SILENT``: it stopped answering (no heartbeat for ``peer_timeout``, or it did not
    answer or connect in time): alive but stopped or hung, or its host cut off;
    ``CLOSED``: its connection closed or broke (the process died, or its host reset the
    connection); ``RELAYED``: another member said so (not seen here);
    ``UNKNOWN``: nobody can tell (the failure monitor itself failed)."""

    SILENT = "silent"
    CLOSED = "closed"
    RELAYED = "relayed"
    UNKNOWN = "unknown"


class PeerLostError(WorkerLostError):
    """A member of the round is gone (killed, stopped, partitioned).

    ``rank`` is the lost member's rank when known; ``direct`` is True when this process
    saw the failure itself (a neighbour) rather than hearing of it from a peer; ``cause``
    says how it was seen (``LossCause``)."""

    def __init__(
        self,
        message: str = "peer lost",
        rank: int | None = None,
        direct: bool = False,
        cause: LossCause = LossCause.UNKNOWN,
    ):
        super().__init__(message)
        self.rank = rank
        self.direct = direct
        self.cause = cause


class CommunicatorClosedError(WorkerLostError):
    """The communicator was closed (a new round arrived) while a collective was pending."""


SHUT_DOWN = "worker shut down"
"""The reason a worker that leaves the job (``elastic.shutdown``) closes its ring with,
as its peers read it: it finished its part of every collective it ran."""


class CollectiveMismatchError(ElasticError):
    """Ranks disagree on the collective being run (kind, op, dtype, shape, root or call
    order): a programming error, not mended by re-forming. The communicator is broken
    afterwards."""


class ShmUnavailableError(ElasticError):
    """``transport="shm"`` (or "hier") was required but the members cannot share memory
    as it needs (different hosts, no /proc access, or an unsupported platform)."""


class SnapshotError(ElasticError):
    """A snapshot of the state cannot be written or read: the state does not pickle, a
    file of the snapshot is missing, torn or corrupt (the message names it)."""


class SnapshotStructureError(SnapshotError):
    """A snapshot holds another state than the one it would load into (an attribute the
    state lacks, an array of another shape or dtype): refused, not loaded. The message
    names its manifest and what differs."""


class WorkerExpelledError(RendezvousError):
    """The driver took this worker out of the job (its host stopped answering, or it
    hung): a newer round left it out and its registration is gone. Its state is stale;
    the process must end (a replacement has taken or will take its slot)."""


class WorkerHandedOverError(ElasticError):
    """This worker's host leaves the job on purpose (a drain: SIGTERM to its agent, or
    discovery removed it) and the round after this worker's was a handover
    (``Plan.handover``): the others go on from the commit this worker holds too, so it
    ends there. ``@elastic.run`` turns it into a clean exit (status 0)."""


class TrainingFinishedError(ElasticError):
    """Another worker's training function returned having committed the final step
    (``JobKeys.training_finished``: that commit is the job's result) while this worker
    waited for a round: it lost its round at the job's last step, or it joined as the
    job ended. No round forms after a finish, and nothing is left for it to do.
    ``@elastic.run`` turns it into a clean exit (status 0)."""


class ReplacedStateWarning(UserWarning):
    """An ``ObjectState`` holds an object that ``restore()`` and ``sync()`` replace with a
    copy (a torch module, optimizer, scheduler, sampler, tensor: anything with
    ``state_dict()``): references the training loop keeps to the original would go on
    with a stale object. ``elastic.torch.TorchState`` loads such objects in place."""


__all__ = [
    "ElasticError",
    "RendezvousError",
    "HostsUpdatedInterrupt",
    "WorkerLostError",
    "PeerLostError",
    "LossCause",
    "CommunicatorClosedError",
    "CollectiveMismatchError",
    "ShmUnavailableError",
    "SnapshotError",
    "SnapshotStructureError",
    "WorkerExpelledError",
    "WorkerHandedOverError",
    "TrainingFinishedError",
    "ReplacedStateWarning",
]


class ShardedStateLostError(ElasticError):
    """A part of the sharded state (``elastic.torch.fully_shard``) and its mirror were
    lost together: no commit can be rebuilt in memory (the message names the newest
    committed step)."""
