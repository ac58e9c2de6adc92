"""What each collective must return, computed by numpy alone: the oracle the collective
tests compare the ring, shared-memory and MPI results against."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from elastic.comm.layout import check_reduce_op, finish_average


def reduce_reference(arrays: Sequence[np.ndarray], op: str) -> np.ndarray:
    """What ``allreduce(op)`` must return for these per-rank inputs."""
    check_reduce_op(op)
    stacked = np.stack([np.asarray(a) for a in arrays])
    if op in ("sum", "average"):
        # Sum in the array's own dtype, like the ring does (integers wrap, floats
        # round in float32 when the inputs are float32).
        out = np.array(stacked[0], copy=True)
        for a in stacked[1:]:
            np.add(out, a, out=out)
        if op == "average":
            finish_average(out, len(arrays))
        return out
    if op == "max":
        return stacked.max(axis=0)
    return stacked.min(axis=0)
