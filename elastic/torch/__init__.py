"""PyTorch support: ``import elastic.torch as et`` (needs the ``torch`` extra).

* ``et.init(backend=None)``: ``elastic.init``, CUDA started first; ``backend`` (or
  ``ELASTIC_TORCH_BACKEND``) picks the data plane: "auto" (NCCL for CUDA tensors, the
  ring for the rest), "ring", "gloo", "nccl" (``elastic.torch.plane``);
* ``et.allreduce(t, op="average")``, ``et.broadcast(t, root=0)``, ``et.allgather(t)``
  and in place ``et.allreduce_``, ``et.broadcast_``: tensors through the job's
  collectives, sharing memory with the transport for CPU tensors;
* ``et.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())``:
  gradients averaged in fused buckets started from backward hooks;
* ``et.broadcast_parameters(model.state_dict(), root_rank=0)``,
  ``et.broadcast_optimizer_state(optimizer, root_rank=0)``;
* ``et.TorchState(model=..., optimizer=..., sampler=..., **attrs)``: a ``State`` that
  commits in memory and restores and syncs in place;
* ``et.fully_shard(module, **kwargs)``: FSDP2's ``fully_shard`` on the job's world;
  a ``TorchState`` holding the module and its optimizer reshards them in place at
  every new round (``elastic.torch.sharded``);
* ``et.ElasticSampler(dataset, shuffle=True, seed=0)``: a DataLoader sampler whose
  progress rides with the state, each sample once per epoch across re-forms.

``import elastic`` never imports torch; this module does.
"""

from __future__ import annotations

from typing import Any

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("elastic.torch needs PyTorch: pip install 'elastic-training[torch]'") from exc

from elastic.errors import (
    ElasticError,
    HostsUpdatedInterrupt,
    ShardedStateLostError,
    WorkerLostError,
)
from elastic.torch import snapshot_codec  # noqa: F401  (tensors in snapshots)
from elastic.torch.collectives import (
    allgather,
    allgather_object,
    allreduce,
    allreduce_,
    broadcast,
    broadcast_,
    broadcast_object,
)
from elastic.torch.optimizer import DistributedOptimizer
from elastic.torch.params import broadcast_optimizer_state, broadcast_parameters
from elastic.torch.plane import BackendUnavailableError
from elastic.torch.sampler import ElasticSampler
from elastic.torch.start import init
from elastic.torch.state import TorchState


def fully_shard(module: Any, **kwargs: Any) -> Any:
    """FSDP2's ``fully_shard`` on the job's world: ``elastic.torch.sharded.fsdp``,
    imported on the first call (FSDP2's import takes 1.5 s a replicated job would pay)."""
    from elastic.torch.sharded.fsdp import fully_shard as shard_on_the_world

    return shard_on_the_world(module, **kwargs)


__all__ = [
    "BackendUnavailableError",
    "DistributedOptimizer",
    "ElasticError",
    "ElasticSampler",
    "HostsUpdatedInterrupt",
    "ShardedStateLostError",
    "TorchState",
    "WorkerLostError",
    "allgather",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "fully_shard",
    "init",
]
