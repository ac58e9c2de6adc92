"""``hvd.elastic``: Horovod's elastic API (``run``, ``TorchState``, ``ObjectState``,
``ElasticSampler``, the two signals) on our runtime's state, loop and sampler.

* ``run`` is ``@elastic.run``: sync the state, call the function; on
  ``HorovodInternalError`` restore the last commit, re-form and go on; on
  ``HostsUpdatedInterrupt`` re-form without rolling back; the reset callbacks after
  every re-form. Where Horovod broadcasts from rank 0, the sync adopts the state of the
  worker holding the most commits, so a step committed anywhere is never lost.
* ``TorchState(model, optimizer, **kwargs)`` is ``elastic.torch.TorchState`` with
  Horovod's two positional arguments: models, optimizers, LR schedulers and samplers
  are committed, restored and synced in place; other attributes are copied.
* ``ObjectState(**kwargs)`` is ``elastic.ObjectState``.
* ``ElasticSampler(dataset, shuffle=True, seed=0)`` is ``elastic.torch.ElasticSampler``
  with a batch size per worker: ``record_batch(batch_idx, batch_size)`` after each
  batch, and after a re-form the rest of the epoch is split among the new world. It
  takes each remaining sample once (Horovod's pads the rest to a multiple of the world
  size with repeated samples), and ``set_epoch(e)`` of the epoch in progress keeps its
  progress, so it may be called at an epoch's start as well as at its end.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import elastic
import elastic.torch as et
from elastic.horovod.errors import HorovodInternalError, HostsUpdatedInterrupt

R = TypeVar("R")


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Decorate ``func(state, *args, **kwargs)`` so that it survives lost and added
    workers (see the module docstring). Joins the job (``hvd.init()``) if the script
    has not.

    Raises:
        HorovodInternalError: a worker was lost in a world that cannot re-form (under
            ``mpiexec``, or alone).
        RendezvousError: no new round forms within the worker's round timeout.
    """
    return elastic.run(func)


class TorchState(et.TorchState):
    """The state of a PyTorch training: ``TorchState(model, optimizer, epoch=0, ...)``.
    ``model`` and ``optimizer`` become ``state.model`` and ``state.optimizer`` (None when
    not given, as in Horovod); each keyword becomes an attribute."""

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model=model, optimizer=optimizer, **kwargs)


class ObjectState(elastic.ObjectState):
    """State made of picklable attributes: ``ObjectState(epoch=0, ...)``.

    ``bcast_object`` and ``get_rank`` are the two arguments of
    ``horovod.common.elastic.ObjectState``, accepted so that code written against it
    runs; they are unused (the state syncs over the job's own world)."""

    def __init__(self, bcast_object: Any = None, get_rank: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)


class ElasticSampler(et.ElasticSampler):
    """A ``DataLoader`` sampler that splits what is left of the epoch among the current
    world, each remaining sample once: ``DataLoader(dataset, batch_size=B,
    sampler=sampler)``, ``sampler.record_batch(batch_idx, B)`` after each batch
    (``batch_idx`` counted from 0 in this pass over the loader), ``set_epoch(e)``, and
    the sampler passed to ``TorchState`` so its progress is committed with the model.

    Raises:
        ValueError: from ``record_batch``, a batch size below 1.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        super().__init__(dataset, shuffle=shuffle, seed=seed)

    def reset(self) -> None:
        """Horovod's sampler re-reads the world here; ours reads it at every pass over
        the loader, so there is nothing to do."""


__all__ = [
    "run",
    "TorchState",
    "ObjectState",
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
]
