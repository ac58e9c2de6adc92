"""The worker API: ``import elastic`` (contract in docs/DESIGN.md).

This module only names the API; each part lives in its own module:

- ``elastic.context``: ``init()``/``shutdown()``, the layout (``rank()``, ``size()``, ...)
  and the collectives, over the world the process was started in (``elastic-run``,
  ``mpiexec``, or alone);
- ``elastic.state``: ``State``, ``ObjectState``, ``NumpyState``;
- ``elastic.loop``: ``@run``;
- ``elastic.sampler``: ``ElasticSampler``;
- ``elastic.average``: ``weighted_average``, the workers' means combined by sample count;
- ``elastic.errors``: the exceptions;
- ``elastic.ps``: ``elastic.ps.connect()``, the parameter-server client (cheap to import);
- ``__version__``: the project's version (``rendezvous.version``).
"""

from __future__ import annotations

from elastic import ps
from elastic.average import weighted_average
from elastic.context import (
    allgather,
    allgather_object,
    allreduce,
    barrier,
    broadcast,
    broadcast_object,
    cross_rank,
    cross_size,
    init,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from elastic.errors import (
    ElasticError,
    HostsUpdatedInterrupt,
    RendezvousError,
    ReplacedStateWarning,
    WorkerLostError,
)
from elastic.loop import run
from elastic.sampler import ElasticSampler
from elastic.state import NumpyState, ObjectState, State


def __getattr__(name: str) -> str:
    # ``__version__`` is read when asked for (pyproject.toml or the package metadata,
    # ``rendezvous.version``), so that ``import elastic`` reads no file.
    if name == "__version__":
        from rendezvous.version import package_version

        return package_version()
    raise AttributeError(f"module 'elastic' has no attribute {name!r}")


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
    "weighted_average",
    "State",
    "ObjectState",
    "NumpyState",
    "run",
    "ElasticSampler",
    "ElasticError",
    "HostsUpdatedInterrupt",
    "WorkerLostError",
    "ReplacedStateWarning",
    "RendezvousError",
    "ps",
]
