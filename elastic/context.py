"""The worker's process-global state: the world this process trains in.

A process joins at most one job, so its membership is process-global, and this module
is the one place that holds it. ``init()`` finds how the process was started and opens
the matching world:

- under ``elastic-run`` (``ELASTIC_RENDEZVOUS`` is set): a ``WorkerRuntime`` that
  follows the job's rounds; its communicator is replaced at every re-form;
- under ``mpiexec``: an ``MpiCommunicator`` over a fixed world;
- alone: a ring of one member.

The layout getters and the collectives below act on that world, and ``elastic``
re-exports them as the worker API (docs/DESIGN.md). The rest of the package asks this module
public questions instead of reading its globals: ``@run`` and the ps client ask
``current_runtime()``, and ``State`` uses this module as its default ``World``
(``elastic.state``), whose ``pending_round()`` says whether a newer round waits.

Each kind of world is built by its own creator, which imports its backend when called:
the communicator stack (sockets, shared memory, the store client) and the optional
mpi4py load only in a process that calls ``init()``, so ``import elastic`` stays cheap
for a process that only wants the names (a ps shard imports the package, never ``init``).
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from elastic.errors import (
    ElasticError,
    TrainingFinishedError,
    WorkerHandedOverError,
    WorkerLostError,
)
from rendezvous import env

if TYPE_CHECKING:
    import numpy as np

    from elastic.comm import Communicator
    from elastic.hangs.watchdog import Watchdog
    from elastic.runtime import WorkerRuntime
    from elastic.snapshots.snapshotter import SnapshotState, Snapshotter

log = logging.getLogger(__name__)


class Layout(NamedTuple):
    """Where this process sits among the processes of its host and across hosts."""

    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


_lock = threading.RLock()
_runtime: WorkerRuntime | None = None  # under elastic-run
_snapshots: Snapshotter | None = None  # with a checkpoint directory (--checkpoint-dir)
_watchdog: Watchdog | None = None  # under elastic-run: the hang watchdog (elastic.hangs)
_static_comm: Communicator | None = None  # a static world's communicator (MPI, or alone)
_static_layout: Layout | None = None  # a static world's layout
#: how this process was started, once ``init()`` opened its world
WorldKind = Literal["elastic", "mpi", "alone"]
_kind: WorldKind | None = None
#: the data planes ``elastic.torch`` offers (``elastic/torch/plane``); "auto" picks by device
TORCH_BACKENDS = ("auto", "ring", "gloo", "nccl")
_torch_backend: str | None = None  # ``init(torch_backend=...)``; None: the environment's


def init(torch_backend: str | None = None) -> None:
    """Join the job (idempotent). Under elastic-run: register, wait for the first round
    that includes this worker, connect to its peers.

    ``torch_backend`` (one of ``TORCH_BACKENDS``) chooses the data plane of
    ``elastic.torch``'s tensors, over ``ELASTIC_TORCH_BACKEND``; None leaves it to the
    variable (default "auto"). Checked before anything starts.

    Raises:
        ValueError: ``torch_backend`` (or the variable) names no backend, or a later
            call asks for another one than the first.
        RendezvousError: the store is unreachable, no round forms in time, or the
            elastic-run environment is malformed (``RendezvousConfigError``, naming
            the variable).
        ImportError: started by mpiexec, but mpi4py is missing.
    """
    global _runtime, _static_comm, _static_layout, _snapshots, _kind, _torch_backend
    chosen = _checked_torch_backend(torch_backend)
    with _lock:
        if _runtime is not None or _static_comm is not None:
            if torch_backend is not None and chosen != _torch_backend:
                raise ValueError(
                    f"elastic.init(torch_backend={torch_backend!r}): this process already "
                    f"runs with torch_backend={_torch_backend!r}"
                )
            return
        _torch_backend = chosen
        if env.text(env.ENV_RENDEZVOUS):
            _runtime = _join_elastic_job()
            _start_watchdog(_runtime)
            _snapshots = _job_snapshots(_runtime)
            _kind = "elastic"
        elif _started_by_mpi():
            _static_comm, _static_layout = _mpi_world()
            _kind = "mpi"
        else:
            _static_comm, _static_layout = _world_of_one()
            _snapshots = _snapshots_alone()
            _kind = "alone"
        atexit.register(_shutdown_at_exit)


def _shutdown_at_exit() -> None:
    """``shutdown``, then a garbage collection while the daemon threads still run: a gRPC
    call left for the collector to end (one in a reference cycle) must not be ended in
    the interpreter's finalization, whose collection can wait forever on a lock held by
    a daemon thread that finalization stopped (``rendezvous.process_exit`` says how;
    the user's script ends its process, so it cannot skip finalization as ours do)."""
    try:
        shutdown()
    finally:
        gc.collect()


def shutdown() -> None:
    """Leave the job and release everything (idempotent; also runs at exit)."""
    global _runtime, _static_comm, _static_layout, _snapshots, _kind, _torch_backend, _watchdog
    with _lock:
        _torch_backend = None
        runtime, _runtime = _runtime, None
        comm, _static_comm = _static_comm, None
        snapshots, _snapshots = _snapshots, None
        watchdog, _watchdog = _watchdog, None
        _static_layout = None
        _kind = None
    if watchdog is not None:
        watchdog.stop()
    if snapshots is not None:
        snapshots.close()
    if runtime is not None:
        runtime.shutdown()
    if comm is not None:
        comm.close("shutdown")


def _checked_torch_backend(argument: str | None) -> str:
    """The backend ``argument`` names, else ``ELASTIC_TORCH_BACKEND``'s, else "auto".

    Raises ValueError naming the argument or the variable when it is not a backend."""
    value, source = argument, "torch_backend"
    if value is None:
        value, source = env.text(env.ENV_TORCH_BACKEND, "auto") or "auto", env.ENV_TORCH_BACKEND
    if value not in TORCH_BACKENDS:
        raise ValueError(f"{source}={value!r}: choose one of {', '.join(TORCH_BACKENDS)}")
    return value


def torch_backend() -> str:
    """The data plane ``elastic.torch`` was asked for: one of ``TORCH_BACKENDS``
    (before ``init()``: the environment's).

    Raises ValueError when ``ELASTIC_TORCH_BACKEND`` names no backend."""
    return _torch_backend or _checked_torch_backend(None)


def world_kind() -> WorldKind | None:
    """How this process's world was opened: "elastic" (under elastic-run), "mpi"
    (under mpiexec) or "alone"; None before ``init()`` and after ``shutdown()``."""
    return _kind


def current_runtime() -> WorkerRuntime | None:
    """The runtime of this worker when it runs under elastic-run and ``init()`` has
    been called; None in a static world or before ``init()``."""
    return _runtime


def pending_round() -> int | None:
    """The id of a round newer than this worker's, once it has been published (no I/O:
    the round watch has already seen it); None when there is none, and always in a
    static world, which never re-forms."""
    runtime = _runtime
    return runtime.pending_round() if runtime is not None else None


def note_commit(commits: int, state: SnapshotState | None = None) -> None:
    """This worker now holds ``commits`` commits (``State.commit`` says so): the runtime
    publishes it from its own thread when this worker is rank 0, and the snapshots of
    ``state`` (the one ``@elastic.run`` runs) take it when it is the one asked for. No
    I/O on this thread."""
    runtime, snapshots = _runtime, _snapshots
    if runtime is not None:
        runtime.committed = commits
        runtime.commit_round = runtime.round_id
    if snapshots is not None and state is not None:
        snapshots.on_commit(state, commits)


def snapshots() -> Snapshotter | None:
    """This process's snapshots (``elastic.snapshots``): None without a checkpoint
    directory, before ``init()``, and under mpiexec (not supported there)."""
    return _snapshots


# ---- the three worlds (each creator imports its backend: see the module docstring) ----


def _join_elastic_job() -> WorkerRuntime:
    """Register with the job elastic-run started and wait for a round with this worker
    (SIGUSR1 prints its stacks from then on: the driver asks only registered workers)."""
    from elastic.hangs.watchdog import install_stack_dump, settings_from_env
    from elastic.runtime import WorkerRuntime, WorkerSettings

    settings = WorkerSettings.from_env()
    settings_from_env()  # (a bad ELASTIC_HANG_TIMEOUT says so before anything starts)
    install_stack_dump()
    runtime = WorkerRuntime(settings)
    runtime.start()
    try:
        runtime.join(after_round=0)
    # Its host left before its first round formed, or the training finished first.
    except (WorkerHandedOverError, TrainingFinishedError) as exc:
        runtime.shutdown()
        log.warning("%s", exc)
        raise SystemExit(0) from None
    except BaseException:
        runtime.shutdown()
        raise
    return runtime


def _start_watchdog(runtime: WorkerRuntime) -> None:
    """The hang watchdog of this worker (``--hang-timeout``; none when it is 0)."""
    global _watchdog
    from elastic.hangs.watchdog import Watchdog, settings_from_env

    _watchdog = Watchdog(runtime, runtime.settings.worker_id, settings_from_env())
    _watchdog.start()


def _job_snapshots(runtime: WorkerRuntime) -> Snapshotter | None:
    """The snapshots of a worker of an elastic-run job, when it has a checkpoint directory."""
    from elastic.snapshots.worlds import snapshots_of_job

    return snapshots_of_job(runtime)


def _snapshots_alone() -> Snapshotter | None:
    """The snapshots of a script that trains alone, when ``ELASTIC_CHECKPOINT_DIR`` is set."""
    from elastic.snapshots.worlds import snapshots_alone

    return snapshots_alone()


def _started_by_mpi() -> bool:
    from elastic.comm import detect_mpi

    return detect_mpi(os.environ)


def _mpi_world() -> tuple[Communicator, Layout]:
    """The fixed world of mpiexec. Local and cross ranks follow the driver planner's
    rule: local = the processes sharing this node, cross = those with my local rank."""
    from mpi4py import MPI  # an optional dependency (the ``mpi`` extra)

    from elastic.comm.mpi import MpiCommunicator

    comm = MpiCommunicator()
    world = MPI.COMM_WORLD
    local = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    cross = world.Split(color=local.Get_rank(), key=world.Get_rank())
    layout = Layout(local.Get_rank(), local.Get_size(), cross.Get_rank(), cross.Get_size())
    local.Free()
    cross.Free()
    return comm, layout


def _world_of_one() -> tuple[Communicator, Layout]:
    """A script run without elastic-run or mpiexec trains alone: a ring of one member."""
    from elastic.comm import Membership, RingCommunicator, RingListener
    from rendezvous.net.auth import make_secret

    secret = make_secret()
    listener = RingListener(secret=secret)
    comm = RingCommunicator(Membership(0, 0, (listener.address,), secret), listener)
    listener.close()  # a world of one never accepts a peer
    return comm, Layout(0, 1, 0, 1)


# ---- the layout ----


def _comm() -> Communicator:
    """The communicator of the current round (or of the static world).

    Raises:
        WorkerLostError: the round is re-forming (no communicator yet).
        ElasticError: ``init()`` has not been called.
    """
    runtime = _runtime
    if runtime is not None:
        comm = runtime.comm
        if comm is None:
            raise WorkerLostError("no communicator: the round is re-forming")
        return comm
    if _static_comm is None:
        raise ElasticError("elastic.init() has not been called")
    return _static_comm


def _layout() -> Layout:
    """Raises ElasticError when ``init()`` has not been called."""
    runtime = _runtime
    m = runtime.member if runtime is not None else None
    if m is not None:
        return Layout(m.local_rank, m.local_size, m.cross_rank, m.cross_size)
    if _static_layout is None:
        raise ElasticError("elastic.init() has not been called")
    return _static_layout


def rank() -> int:
    """This worker's rank in the current round (0 is the oldest survivor)."""
    return _comm().rank


def size() -> int:
    """The number of workers in the current round."""
    return _comm().size


def local_rank() -> int:
    """This worker's rank among the workers of its host."""
    return _layout().local_rank


def local_size() -> int:
    """The number of workers on this worker's host."""
    return _layout().local_size


def cross_rank() -> int:
    """This worker's rank among the workers with its local rank (one per host)."""
    return _layout().cross_rank


def cross_size() -> int:
    """The number of workers with this worker's local rank."""
    return _layout().cross_size


# ---- the collectives (each raises WorkerLostError when the round breaks under it) ----


def allreduce(x: Any, op: str = "sum") -> np.ndarray:
    """A new array: ``x`` reduced over all workers (sum, average, max, min)."""
    return _comm().allreduce(x, op=op)


def broadcast(x: Any, root: int = 0) -> np.ndarray:
    """``root``'s array, on every worker."""
    return _comm().broadcast(x, root=root)


def allgather(x: Any) -> np.ndarray:
    """Arrays of all workers concatenated on axis 0 in rank order."""
    return _comm().allgather(x)


def broadcast_object(obj: Any = None, root: int = 0) -> Any:
    """``root``'s picklable object, on every worker."""
    return _comm().broadcast_object(obj, root=root)


def allgather_object(obj: Any) -> list:
    """Every worker's picklable object, in rank order."""
    return _comm().allgather_object(obj)


def barrier() -> None:
    """Return once every worker of the round has called it."""
    _comm().barrier()


# The worker API this module gives the package face (``elastic/__init__.py`` exports
# exactly these); ``Layout``, ``current_runtime``, ``pending_round``, ``note_commit`` and
# ``world_kind`` are the worker library's own (``elastic.state``, ``elastic.loop``,
# ``elastic.ps``, ``elastic.horovod``).
__all__ = [
    "init",
    "shutdown",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "allreduce",
    "broadcast",
    "allgather",
    "broadcast_object",
    "allgather_object",
    "barrier",
]
