"""``ElasticSampler``: every sample of an epoch processed once, whatever the world size does.

An epoch is a fixed permutation of the sample indices (seeded by ``seed`` and the epoch).
Each global step consumes the next indices of that permutation, and the world's workers
split them: ``global_batch_size=B`` makes every step ``B`` indices whatever the world
size (the epoch's last step takes what is left), the older per-worker ``batch_size`` of
``batches()`` makes a step of ``W`` workers ``W*batch_size``. The indices of a step are
shared out as evenly as possible: sizes differ by at most one, and a worker gets none
only when the step has fewer indices than there are workers (the epoch's last step, or a
global batch smaller than the world). Such a worker still takes the step, so collectives
stay matched, and its empty share has weight zero in ``weighted_average``
(``elastic.average``), the documented way to combine the workers' gradients.

So progress is one number, the count of indices consumed, and a world of any size can
continue from it. That number is part of the training state: inside ``@elastic.run`` the
sampler binds to the running ``State``, records progress when the state commits, and
finds it again after a re-form (when the sampler is built anew).
``batches(batch_size, start)`` starts after ``start`` committed steps of the epoch: the
state knows how many indices those steps consumed, even if the world size changed
between them.

The sampler's collaborators: the running state (``elastic.state.current_state()``) and
the layout of the round (``elastic.context.rank()``/``size()``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

import elastic.context as context
from elastic.state import State, current_state

#: the State attribute under which samplers keep their progress
PROGRESS_ATTR = "_elastic_sampler_progress"


def epoch_order(num_samples: int, epoch: int, shuffle: bool, seed: int) -> np.ndarray:
    """The order of sample indices in ``epoch`` (pure, identical on every worker)."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(num_samples).astype(np.int64)


def even_piece(total: int, parts: int, index: int) -> tuple[int, int]:
    """The slice ``[lo, hi)`` of piece ``index`` when ``total`` items are cut into
    ``parts`` consecutive pieces whose sizes differ by at most one, the larger first
    (pure)."""
    base, extra = divmod(total, parts)
    lo = index * base + min(index, extra)
    return lo, lo + base + (1 if index < extra else 0)


def step_share(
    offset: int, num_samples: int, step_samples: int, rank: int, size: int
) -> tuple[int, int, int]:
    """The slice ``[lo, hi)`` of the epoch order that ``rank`` processes in the global step
    of ``step_samples`` indices starting at ``offset`` (fewer when the epoch has fewer
    left), and the offset after the step (pure). Every rank takes the step; a rank's share
    is empty only when the step has fewer indices than ranks."""
    step = min(num_samples - offset, step_samples)
    lo, hi = even_piece(step, size, rank)
    return offset + lo, offset + hi, offset + step


def rank_share(
    offset: int, num_samples: int, batch_size: int, rank: int, size: int
) -> tuple[int, int, int]:
    """``step_share`` of a step of ``batch_size`` indices per rank (pure): a full step
    gives each rank ``batch_size``, the epoch's last one splits what is left evenly."""
    return step_share(offset, num_samples, batch_size * size, rank, size)


def micro_pieces(count: int, max_micro_batch: int | None) -> list[tuple[int, int]]:
    """``[lo, hi)`` slices cutting a share of ``count`` indices into the fewest pieces of
    at most ``max_micro_batch`` (all of it when None), of sizes differing by at most one
    (pure). None for an empty share."""
    if count == 0:
        return []
    parts = 1 if max_micro_batch is None else -(-count // max_micro_batch)
    return [even_piece(count, parts, i) for i in range(parts)]


def _check_size(name: str, value: int | None) -> int | None:
    """Raises ValueError for a size that is given and below 1."""
    if value is not None and value < 1:
        raise ValueError(f"{name} must be >= 1, not {value}")
    return None if value is None else int(value)


class ElasticSampler:
    """The sample indices of each epoch, shared out among the workers of the round (see
    the module docstring).

    ``global_batch_size``: the samples every step consumes across the world, whatever
    its size; ``batches()`` then takes no batch size. ``max_micro_batch``: the largest
    piece ``micro_batches()`` cuts a share into (gradient accumulation).

    Raises ValueError for a negative ``num_samples`` or a size below 1."""

    def __init__(
        self,
        num_samples: int,
        shuffle: bool = True,
        seed: int = 0,
        global_batch_size: int | None = None,
        max_micro_batch: int | None = None,
    ):
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, not {num_samples}")
        self.num_samples = int(num_samples)
        self.shuffle = shuffle
        self.seed = seed
        self.global_batch_size = _check_size("global_batch_size", global_batch_size)
        self.max_micro_batch = _check_size("max_micro_batch", max_micro_batch)
        self.epoch = 0
        self._state: State | None = None
        self._bound_state()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _bound_state(self) -> State | None:
        # Bind at first use too: a sampler built outside ``@elastic.run`` but iterated
        # inside it still records its progress in the running state.
        if self._state is None:
            self._state = current_state()
        return self._state

    def _progress(self) -> dict:
        """{"epoch": e, "key": ..., "offsets": {committed steps: indices consumed after them}}"""
        state = self._bound_state()
        key = f"{self.num_samples}:{self.shuffle}:{self.seed}"
        progress = getattr(state, PROGRESS_ATTR, None) if state is not None else None
        if not progress or progress.get("epoch") != self.epoch or progress.get("key") != key:
            progress = {"epoch": self.epoch, "key": key, "offsets": {0: 0}}
            if state is not None:
                setattr(state, PROGRESS_ATTR, progress)
        return progress

    def _start_offset(self, step_samples: int, start: int) -> int:
        """Indices consumed after ``start`` steps: recorded when those steps were committed
        (exact whatever the world sizes were); otherwise extrapolated with the current
        step size from the last recorded step before ``start``."""
        offsets = self._progress()["offsets"]
        if start in offsets:
            return offsets[start]
        known = max(k for k in offsets if k <= start) if any(k <= start for k in offsets) else 0
        base = offsets.get(known, 0)
        return min(self.num_samples, base + (start - known) * step_samples)

    def _step_samples(self, batch_size: int | None, size: int) -> int:
        """Indices per global step. Raises ValueError for a batch size that does not fit
        the sampler's mode."""
        if self.global_batch_size is not None:
            if batch_size is not None:
                raise ValueError(
                    f"this sampler has global_batch_size={self.global_batch_size}: "
                    f"call batches() without a batch_size (got {batch_size})"
                )
            return self.global_batch_size
        if batch_size is None:
            raise ValueError("batches() needs a batch_size (or the sampler a global_batch_size)")
        _check_size("batch_size", batch_size)
        return int(batch_size) * size

    def batches(self, batch_size: int | None = None, start: int = 0) -> Iterator[np.ndarray]:
        """Yield this rank's index arrays, one per global step, from committed step
        ``start``. An array is empty when the step has fewer indices than workers: the
        rank still takes the step, with weight 0 (``elastic.weighted_average``).

        ``batch_size``: indices per rank and step, without ``global_batch_size`` only.

        Raises ValueError for a batch size below 1, a missing one without
        ``global_batch_size``, or one given with it."""
        rank, size = context.rank(), context.size()
        step_samples = self._step_samples(batch_size, size)
        order = epoch_order(self.num_samples, self.epoch, self.shuffle, self.seed)
        progress = self._progress()
        offset = self._start_offset(step_samples, start)
        for steps in [k for k in progress["offsets"] if k > start]:
            del progress["offsets"][steps]  # never committed from where we resume
        progress["offsets"][start] = offset
        state = self._state
        if state is not None:
            state._pending_progress = (progress, [])
        steps_done = start
        while offset < self.num_samples:
            lo, hi, after = step_share(offset, self.num_samples, step_samples, rank, size)
            steps_done += 1
            if state is not None:
                # Counted as consumed when the state commits, not before; every step since
                # the last commit is recorded then (a commit may cover several steps).
                pending = state._pending_progress
                if pending is None or pending[0] is not progress:
                    pending = state._pending_progress = (progress, [])
                pending[1].append((steps_done, after))
            yield order[lo:hi]
            offset = after

    def micro_batches(self, indices: np.ndarray) -> list[np.ndarray]:
        """``indices`` (a share from ``batches()``) cut into the fewest pieces of at most
        ``max_micro_batch`` (one piece without it), of sizes differing by at most one; none
        for an empty share. Accumulate a gradient over them, weighting each by its share of
        ``len(indices)``."""
        return [indices[lo:hi] for lo, hi in micro_pieces(len(indices), self.max_micro_batch)]


__all__ = ["ElasticSampler"]
