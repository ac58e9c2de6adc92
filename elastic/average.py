"""``weighted_average``: the mean over every worker's samples, from each worker's mean over
its own share.

The workers of a step may hold different numbers of samples: a global batch that the
world size does not divide, the last step of an epoch, a world that changed size. The
mean of the workers' means (``allreduce(g, op="average")``) then weighs a sample of a
small share more than one of a large share, and a worker without a sample sends the mean
over nothing (NaN) to everyone. Weighting each worker's mean by its sample count gives
the mean over the step's samples, the gradient one process would compute on all of them.
A worker with a count of 0 contributes nothing, whatever its value (NaN included).

One allreduce carries every array and the count. The packing is pure (``pack``,
``unpack``); ``weighted_average`` adds the collective.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable, Union

import numpy as np

import elastic.context as context

#: an array, a list or tuple of arrays, or a dict of them (returned in the same shape)
Values = Union[np.ndarray, Sequence[np.ndarray], Mapping[Any, np.ndarray]]


def _arrays(value: Values) -> tuple[list[np.ndarray], Callable[[list[np.ndarray]], Any]]:
    """The arrays of ``value`` in a fixed order, and how to rebuild its shape from them."""
    if isinstance(value, Mapping):
        keys = list(value)
        return [np.asarray(value[k]) for k in keys], lambda out: dict(zip(keys, out))
    if isinstance(value, (list, tuple)):
        kind = type(value)
        return [np.asarray(v) for v in value], lambda out: kind(out)
    return [np.asarray(value)], lambda out: out[0]


def _wire_dtype(arrays: list[np.ndarray]) -> np.dtype:
    # At least float32, so that the counts stay exact far beyond any batch.
    return np.result_type(np.float32, *(a.dtype for a in arrays if a.dtype.kind == "f"))


def pack(value: Values, count: int) -> np.ndarray:
    """This worker's message: every array of ``value`` times ``count``, flattened, and
    ``count`` last; zeros for the arrays when ``count`` is 0 (pure).

    Raises ValueError for a negative or fractional count."""
    if count < 0 or int(count) != count:
        raise ValueError(f"count must be a whole number >= 0, not {count!r}")
    arrays, _ = _arrays(value)
    dtype = _wire_dtype(arrays)
    flat = np.empty(sum(a.size for a in arrays) + 1, dtype=dtype)
    at = 0
    for a in arrays:
        part = flat[at : at + a.size]
        if count:
            np.multiply(a.reshape(-1), count, out=part, casting="unsafe")
        else:
            part.fill(0)  # the mean over no sample (NaN, or anything) counts for nothing
        at += a.size
    flat[-1] = count
    return flat


def unpack(total: np.ndarray, like: Values) -> Any:
    """The weighted mean from the sum of every worker's ``pack``, in ``like``'s shape and
    dtypes (a non-float array comes back as float64) (pure).

    Raises ValueError when the counts add up to 0 (no worker had a sample)."""
    count = float(total[-1])
    if count == 0:
        raise ValueError("weighted_average: every worker's count is 0, no sample to average")
    arrays, rebuild = _arrays(like)
    out, at = [], 0
    for a in arrays:
        dtype = a.dtype if a.dtype.kind == "f" else np.dtype(np.float64)
        out.append((total[at : at + a.size] / count).astype(dtype, copy=False).reshape(a.shape))
        at += a.size
    return rebuild(out)


def weighted_average(value: Values, count: int) -> Any:
    """The mean over every worker's samples, given this worker's mean ``value`` over its
    ``count`` samples (an array, or a list, tuple or dict of arrays, returned in the
    same shape): the sum of ``count * value`` over the world divided by the sum of the
    counts, in one allreduce. Every worker of the round calls it, those with an empty
    share too: with ``count`` 0 the value is ignored (it may be NaN) but must have the
    shapes of the others'.

    Raises:
        ValueError: a negative count, or every worker's count is 0.
        WorkerLostError: the round broke during the allreduce (as ``allreduce``).
    """
    return unpack(context.allreduce(pack(value, count), op="sum"), value)


__all__ = ["weighted_average"]
