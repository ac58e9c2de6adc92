"""Horovod's PyTorch worker API on our runtime: ``import elastic.horovod as hvd``.

A script written for ``horovod.torch`` (elastic or not) runs under ``elastic-run``,
under ``mpiexec`` and alone with one changed line, its import. Every name maps onto
our runtime's own equivalent; nothing here reimplements a collective. The parts, each
in its own module (whose ``__all__`` this face repeats):

- ``basics``: ``init()``, ``shutdown()``, ``is_initialized()``, the layout (``rank()``,
  ``size()``, ``local_rank()``, ``local_size()``, ``cross_rank()``, ``cross_size()``) and
  what the runtime is built with (``nccl_built()``, ``mpi_enabled()``, ...);
- ``ops``: the reductions ``Average``, ``Sum``, ``Min``, ``Max`` (``Adasum`` and
  ``Product`` are refused where used);
- ``compression``: ``Compression.none``, ``Compression.fp16``;
- ``collectives``: ``allreduce``/``allreduce_``, ``allgather``, ``broadcast``/
  ``broadcast_``, ``broadcast_object``, ``allgather_object``, ``barrier``,
  ``broadcast_parameters``, ``broadcast_optimizer_state``;
- ``optimizer``: ``DistributedOptimizer``;
- ``elastic`` (``hvd.elastic``): ``run``, ``TorchState``, ``ObjectState``,
  ``ElasticSampler``;
- ``errors``: ``HorovodInternalError`` (our ``WorkerLostError``),
  ``HostsUpdatedInterrupt`` (ours), ``HorovodUnsupportedError``.

Out of scope: ``horovod.tensorflow``, ``horovod.keras`` and ``horovod.mxnet`` (and
Spark, Ray's executors, process sets, ``join()``, ``alltoall``, ``reducescatter``,
grouped and asynchronous collectives, ``SyncBatchNorm``, timelines). Horovod has no
numpy frontend, so there is none to map: numpy scripts use ``import elastic`` itself.
What differs from Horovod, and what to do instead of its examples' elastic pitfalls, is
in the README's "Coming from Horovod".

Needs PyTorch (the ``torch`` extra), as ``horovod.torch`` does.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "elastic.horovod needs PyTorch, as horovod.torch does: pip install 'elastic-training[torch]'"
    ) from exc

from elastic.horovod import basics, collectives, elastic, errors, optimizer
from elastic.horovod.basics import *  # noqa: F403  (the face: each module's __all__)
from elastic.horovod.collectives import *  # noqa: F403
from elastic.horovod.compression import Compression
from elastic.horovod.errors import *  # noqa: F403
from elastic.horovod.ops import Adasum, Average, Max, Min, Product, Sum
from elastic.horovod.optimizer import *  # noqa: F403

__all__ = ["elastic", "Compression", "Average", "Sum", "Min", "Max", "Adasum", "Product"]
__all__ += basics.__all__
__all__ += collectives.__all__
__all__ += optimizer.__all__
__all__ += errors.__all__
