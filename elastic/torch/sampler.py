"""``ElasticSampler`` for a ``torch.utils.data.DataLoader``: each sample of an epoch is
processed exactly once across re-forms, whatever the world size does.

An epoch is a fixed permutation of the dataset's indices (seeded by ``seed`` and the
epoch, the same as the numpy sampler's). Progress is one number, the count of positions
of that permutation consumed, and every rank knows it without communicating: after
``record_batch(i, batch_size)`` in a world of ``W`` workers, the first
``start + (i + 1) * W * batch_size`` positions are consumed (``start`` being the
progress when iteration began). That works because each rank takes the positions
congruent to its rank modulo ``W`` of what is left, so global step ``i`` consumes
exactly the next ``W * batch_size`` positions whatever the batch size.

Committed with the ``TorchState`` it is passed to, the progress is restored and synced
with it; iterating after a re-form yields this worker's share of what is left.

The last step of an epoch splits what is left evenly: every rank gets at least one
sample and takes the same number of steps. One case cannot be met with a DataLoader's
fixed batch size: a last step with fewer samples than workers (``0 < left % (W * B) <
W``). Ranks without a sample then take one of that step's samples again, so every rank
still takes the step with a non-empty batch; it is the only repeat. It never happens
when the dataset size modulo the batch size is 0 or at least the largest world size
(every full step consumes a multiple of ``B``), e.g. 1437 digits in batches of 32.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch.utils.data

from elastic.sampler import epoch_order
from elastic.torch import _backend


def rank_positions(remaining: int, rank: int, size: int, batch_size: int | None) -> np.ndarray:
    """The positions (0-based, within what is left of the epoch) that ``rank`` takes,
    in order (pure).

    Positions congruent to ``rank`` modulo ``size``; when the last step of the epoch
    (known with ``batch_size``) would leave some rank without a sample, those ranks
    take a sample of the last step again so every rank takes the same number of steps.
    """
    mine = np.arange(rank, remaining, size, dtype=np.int64)
    if batch_size is None or remaining == 0:
        return mine
    step = size * batch_size
    tail = remaining % step
    if 0 < tail < size and rank >= tail:
        mine = np.append(mine, remaining - tail + rank % tail)
    return mine


def progress_after(start: int, batches: int, batch_size: int, size: int, total: int) -> int:
    """Positions consumed once ``batches`` steps of ``batch_size`` per rank ran in a
    world of ``size`` from ``start`` (pure)."""
    return min(total, start + batches * batch_size * size)


class ElasticSampler(torch.utils.data.Sampler):
    """A sampler for ``DataLoader(dataset, batch_size=B, sampler=...)``.

    ``set_epoch(e)`` at the start of each epoch; ``record_batch(batch_idx, B)`` after
    each processed batch (``batch_idx`` counted from 0 in this iteration of the
    loader); pass it to ``TorchState(sampler=...)``. ``batch_size`` (optional, the
    loader's) lets the first epoch's last step be split evenly; it is learnt from
    ``record_batch`` otherwise.

    Raises ValueError for a negative length or a bad batch size."""

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0, batch_size: int | None = None):
        self.num_samples = len(dataset)
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.batch_size = batch_size
        self.processed = 0  # positions of this epoch's order consumed
        self._start = 0  # progress when the current iteration began
        self._size = 1  # world size of the current iteration

    # ---- progress ----
    def set_epoch(self, epoch: int) -> None:
        """Select ``epoch``'s order; progress starts at 0 unless it is the epoch already
        in progress (as after a restore)."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.processed = 0

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count step ``batch_idx`` of this iteration (``batch_size`` per rank) as
        processed. Raises ValueError for a batch size below 1."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        if self.batch_size is None:
            self.batch_size = int(batch_size)
        self.processed = max(
            self.processed,
            progress_after(self._start, batch_idx + 1, batch_size, self._size, self.num_samples),
        )

    @property
    def remaining(self) -> int:
        return self.num_samples - self.processed

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "processed": self.processed,
            "batch_size": self.batch_size,
            "num_samples": self.num_samples,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict) -> None:
        """Raises ValueError when ``state`` belongs to a sampler of another dataset."""
        for key in ("num_samples", "seed", "shuffle"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state for {key}={state[key]!r}, this sampler "
                    f"has {getattr(self, key)!r}"
                )
        self.epoch = state["epoch"]
        self.processed = state["processed"]
        if state["batch_size"] is not None:
            self.batch_size = state["batch_size"]

    # ---- iteration ----
    def _mine(self) -> np.ndarray:
        rank, size = _backend.world_rank(), _backend.world_size()
        order = epoch_order(self.num_samples, self.epoch, self.shuffle, self.seed)
        rest = order[self.processed :]
        return rest[rank_positions(len(rest), rank, size, self.batch_size)]

    def __iter__(self) -> Iterator[int]:
        self._start, self._size = self.processed, _backend.world_size()
        return iter(self._mine().tolist())

    def __len__(self) -> int:
        return len(self._mine())
