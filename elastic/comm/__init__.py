"""The worker library's data plane: collectives over a ring (TCP, or shared memory on
one host) or over MPI.

A worker opens one ``RingListener`` at init, publishes its ``address``, and for every
round builds ``RingCommunicator(Membership(...), listener, CommSettings(...))``. Under
``mpiexec`` (``detect_mpi(os.environ)``), ``MpiCommunicator()`` offers the same calls on
a fixed world.

The parts: ``base`` (the ``Communicator`` interface and its settings; the errors it
raises are the worker's public ones, ``elastic.errors``), ``ring``
(one round's communicator), ``mpi``; ``peers/`` (the listener, the links to both ring
neighbours, the failure monitor); ``transports/`` (how the bytes move: TCP ring, shared
memory, hierarchical, and the rule that picks one); ``layout`` (segments, chunks,
reductions), ``wire`` (byte formats) and ``outbuf`` (recycled result buffers), shared by
all.
"""

from elastic.comm.base import CommSettings, Communicator, Membership
from elastic.comm.mpi import MpiCommunicator, detect_mpi
from elastic.comm.peers.listener import RingListener
from elastic.comm.ring import RingCommunicator
from elastic.errors import (
    CollectiveMismatchError,
    CommunicatorClosedError,
    PeerLostError,
    ShmUnavailableError,
    WorkerLostError,
)

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
