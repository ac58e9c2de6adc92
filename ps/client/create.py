"""What a client sends each shard to create its variables (pure): one ``Create`` per
shard and optimizer config, holding that shard's slices (placed by ``partition.place``).
``init`` sends every shard its requests at once; a shard that lost its variables gets
its own again, alone (``only``), from the thread that found it out."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ps import wire
from ps.partition import place
from ps.protocol import CreateArgs

# one Create request: its arguments and its payload's pieces
CreateRequest = tuple[CreateArgs, list]


def create_requests(
    values: Mapping[str, tuple[np.ndarray, dict]],
    num_shards: int,
    threshold: int,
    only: int | None = None,
) -> dict[int, list[CreateRequest]]:
    """The ``Create`` requests of each shard (of shard ``only`` alone when given) for
    ``values`` (name -> (initial value, optimizer config)) split at ``threshold``
    bytes; a shard that holds none of them has no entry. Raises PSShapeError for a
    dtype that cannot travel."""
    configs: dict[str, dict] = {}
    per_shard: dict[tuple[int, str], list] = {}
    for name, (array, config) in values.items():
        key = repr(sorted(config.items()))
        configs[key] = config
        for sl in place(name, array.shape, array.dtype, num_shards, threshold):
            if only is None or sl.shard == only:
                per_shard.setdefault((sl.shard, key), []).append(
                    ({"slice": sl.to_dict()}, sl.take(array))
                )
    out: dict[int, list[CreateRequest]] = {}
    for (shard, key), tensors in per_shard.items():
        out.setdefault(shard, []).append((CreateArgs(configs[key]), wire.encode_parts({}, tensors)))
    return out
