"""The worker API's exceptions (contract names: see docs/DESIGN.md)."""

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


class CommunicatorClosedError(WorkerLostError):
    """The communicator was closed (a new round arrived) while a collective was pending."""


class WorkerExpelledError(RendezvousError):
    """The driver took this worker out of the job (its host stopped answering, or it
    hung): a newer round left it out and its registration is gone. Its state is stale;
    the process must end (a replacement has taken or will take its slot)."""


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
    "CommunicatorClosedError",
    "WorkerExpelledError",
    "ReplacedStateWarning",
]
