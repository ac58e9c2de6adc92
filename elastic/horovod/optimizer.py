"""``hvd.DistributedOptimizer``: Horovod's signature over ``elastic.torch``'s optimizer.

What each argument becomes:

* ``op``: ``hvd.Average`` or ``hvd.Sum``, as our reducer's "average" or "sum";
  ``hvd.Adasum`` is refused in one line (``HorovodUnsupportedError``).
* ``compression``: ``hvd.Compression.none`` or ``hvd.Compression.fp16``, which our
  reducer applies inside its fused buckets.
* ``backward_passes_per_step``: the same (gradients accumulate locally that many
  backward passes, then one reduction).
* ``gradient_predivide_factor``: Horovod splits the averaging's division around the sum
  to keep fp16 sums in range; the result is the same average, which ours computes
  anyway, so the factor only has to be valid (positive, and with ``hvd.Average`` only,
  as Horovod requires).
* ``num_groups``/``groups``: Horovod's fusion groups; ours fuses gradients in buckets of
  about 25 MiB in the model's reverse order, which these do not change.
* ``sparse_as_dense``: sparse gradients (``nn.Embedding(sparse=True)``) are not
  supported, so ``True`` is refused; ``False`` changes nothing for dense gradients.

The optimizer returned is the one passed in, made distributed (``elastic.torch``), so
schedulers and ``hvd.elastic.TorchState`` that hold it see the same object. It has
Horovod's ``synchronize()``, ``skip_synchronize()`` and ``backward_passes_per_step``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

import elastic.torch as et
from elastic.horovod.compression import Compression, reducer_compression
from elastic.horovod.errors import HorovodUnsupportedError
from elastic.horovod.ops import Average, ReduceOp, Sum, op_name


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable | None = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: ReduceOp = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
) -> Any:
    """``optimizer`` made distributed: before every ``step()`` its gradients are
    averaged (``op=hvd.Sum``: summed) over the world, in fused buckets started from
    backward hooks. Returns the same object.

    Raises:
        HorovodUnsupportedError: ``op`` is ``hvd.Adasum`` (or another reduction that
            gradients cannot take here), ``compression`` is a compressor of the
            user's own, or ``sparse_as_dense=True``.
        ValueError: ``gradient_predivide_factor`` is not positive, or differs from 1
            with an op other than ``hvd.Average``; ``backward_passes_per_step`` is
            below 1; ``named_parameters`` has duplicate names or misses a parameter of
            the optimizer.
        TypeError: ``optimizer`` is not a torch optimizer, or is already distributed.
    """
    how = op_name(op)
    if op not in (Average, Sum):
        raise HorovodUnsupportedError(
            f"DistributedOptimizer(op={op!r}) is not supported by elastic.horovod: "
            "gradients are averaged (hvd.Average) or summed (hvd.Sum)"
        )
    if gradient_predivide_factor <= 0:
        raise ValueError(
            f"gradient_predivide_factor must be positive, not {gradient_predivide_factor}"
        )
    if gradient_predivide_factor != 1.0 and op is not Average:
        raise ValueError("gradient_predivide_factor other than 1.0 needs op=hvd.Average")
    if sparse_as_dense:
        raise HorovodUnsupportedError(
            "DistributedOptimizer(sparse_as_dense=True) is not supported by "
            "elastic.horovod: sparse gradients are not; build embeddings with sparse=False"
        )
    return et.DistributedOptimizer(
        optimizer,
        named_parameters=named_parameters,
        op=how,
        backward_passes_per_step=backward_passes_per_step,
        compression=reducer_compression(compression),
    )


__all__ = ["DistributedOptimizer"]
