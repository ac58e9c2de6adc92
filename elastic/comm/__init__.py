"""The worker library's data plane: collectives over a ring (TCP, or shared memory on
one host) or over MPI.

A worker opens one ``RingListener`` at init, publishes its ``address``, and for every
round builds ``RingCommunicator(Membership(...), listener, CommSettings(...))``. Under
``mpiexec`` (``detect_mpi(os.environ)``), ``MpiCommunicator()`` offers the same calls on
a fixed world.
"""

from elastic.errors import CommunicatorClosedError, PeerLostError, WorkerLostError

from .base import (
    CollectiveMismatchError,
    CommSettings,
    Communicator,
    Membership,
    ShmUnavailableError,
)
from .listener import RingListener
from .mpi import MpiCommunicator, detect_mpi
from .ring import RingCommunicator

__all__ = [
    "CommSettings",
    "Communicator",
    "Membership",
    "RingListener",
    "RingCommunicator",
    "MpiCommunicator",
    "detect_mpi",
    "PeerLostError",
    "CollectiveMismatchError",
    "ShmUnavailableError",
    "CommunicatorClosedError",
    "WorkerLostError",
]
