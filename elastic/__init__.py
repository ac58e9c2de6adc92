"""The worker API: ``import elastic`` (contract in DESIGN.md).

``init()`` finds how the process was started: by ``elastic-run`` (rounds from the
rendezvous store, TCP ring collectives, elastic), under ``mpiexec`` (mpi4py collectives,
fixed world), or alone (a world of one).
"""
from __future__ import annotations

import atexit
import os
import threading

import rendezvous  # noqa: F401  (selects the protobuf runtime etcd's client needs, first)
from elastic import ps  # noqa: F401  (elastic.ps.connect() after a plain import)
from elastic.errors import (ElasticError, HostsUpdatedInterrupt, RendezvousError,
                            WorkerLostError)
from elastic.loop import run
from elastic.sampler import ElasticSampler
from elastic.state import NumpyState, ObjectState, State
from rendezvous import env as _env

_lock = threading.RLock()
_runtime = None        # WorkerRuntime under elastic-run
_static_comm = None    # the communicator of a static world (MPI, or a world of one)
_static_layout = None  # (local_rank, local_size, cross_rank, cross_size) of a static world


def init() -> None:
    """Join the job (idempotent). Under elastic-run: register, wait for the first round
    that includes this worker, connect to its peers.

    Raises RendezvousError when the store is unreachable or no round forms in time."""
    global _runtime, _static_comm, _static_layout
    with _lock:
        if _runtime is not None or _static_comm is not None:
            return
        if os.environ.get(_env.ENV_RENDEZVOUS):
            from elastic.runtime import WorkerRuntime, WorkerSettings
            runtime = WorkerRuntime(WorkerSettings.from_env())
            runtime.start()
            try:
                runtime.join(after_round=0)
            except BaseException:
                runtime.shutdown()
                raise
            _runtime = runtime
        else:
            from elastic.comm import detect_mpi
            if detect_mpi(os.environ):
                from elastic.comm.mpi import MpiCommunicator
                _static_comm = MpiCommunicator()
                _static_layout = _mpi_layout()
            else:
                _static_comm = _world_of_one()
                _static_layout = (0, 1, 0, 1)
        atexit.register(shutdown)


def _mpi_layout() -> tuple[int, int, int, int]:
    """Local and cross ranks under mpiexec, by the same rule the driver's planner uses:
    local = the processes sharing this node, cross = the processes with my local rank."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    local = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    cross = world.Split(color=local.Get_rank(), key=world.Get_rank())
    layout = (local.Get_rank(), local.Get_size(), cross.Get_rank(), cross.Get_size())
    local.Free()
    cross.Free()
    return layout


def _world_of_one():
    """A script run without elastic-run or mpiexec trains alone: a ring of one member."""
    from elastic.comm import Membership, RingCommunicator, RingListener
    from rendezvous.auth import make_secret
    secret = make_secret()
    listener = RingListener(secret=secret)
    comm = RingCommunicator(Membership(0, 0, (listener.address,), secret), listener)
    listener.close()  # a world of one never accepts a peer
    return comm


def shutdown() -> None:
    """Leave the job and release everything (idempotent; also runs at exit)."""
    global _runtime, _static_comm
    with _lock:
        runtime, _runtime = _runtime, None
        comm, _static_comm = _static_comm, None
    if runtime is not None:
        runtime.shutdown()
    if comm is not None:
        comm.close("shutdown")


def _runtime_if_started():
    return _runtime


def _reform() -> None:
    """Join the next round (used by ``@run``)."""
    if _runtime is not None:
        _runtime.join()


def _comm():
    if _runtime is not None:
        comm = _runtime.comm
        if comm is None:
            raise WorkerLostError("no communicator: the round is re-forming")
        return comm
    if _static_comm is None:
        raise ElasticError("elastic.init() has not been called")
    return _static_comm


def rank() -> int:
    return _comm().rank


def size() -> int:
    return _comm().size


def _layout() -> tuple[int, int, int, int]:
    if _runtime is not None and _runtime.plan is not None:
        m = _runtime.member
        return m.local_rank, m.local_size, m.cross_rank, m.cross_size
    if _static_layout is None:
        raise ElasticError("elastic.init() has not been called")
    return _static_layout


def local_rank() -> int:
    return _layout()[0]


def local_size() -> int:
    return _layout()[1]


def cross_rank() -> int:
    return _layout()[2]


def cross_size() -> int:
    return _layout()[3]


def allreduce(x, op: str = "sum"):
    """A new array: ``x`` reduced over all workers (sum, average, max, min)."""
    return _comm().allreduce(x, op=op)


def broadcast(x, root: int = 0):
    return _comm().broadcast(x, root=root)


def allgather(x):
    """Arrays of all workers concatenated on axis 0 in rank order."""
    return _comm().allgather(x)


def broadcast_object(obj, root: int = 0):
    return _comm().broadcast_object(obj, root=root)


def allgather_object(obj) -> list:
    return _comm().allgather_object(obj)


def barrier() -> None:
    _comm().barrier()


__all__ = ["init", "shutdown", "rank", "size", "local_rank", "local_size", "cross_rank",
           "cross_size", "allreduce", "broadcast", "allgather", "broadcast_object",
           "allgather_object", "barrier", "State", "ObjectState", "NumpyState", "run",
           "ElasticSampler", "ElasticError", "HostsUpdatedInterrupt", "WorkerLostError",
           "RendezvousError", "ps"]
