"""``ElasticSampler``: every sample of an epoch processed once, whatever the world size does.

An epoch is a fixed permutation of the sample indices (seeded by ``seed`` and the epoch).
A global step of a world of ``W`` workers with batch size ``B`` consumes the next ``W*B``
indices of that permutation; rank ``r`` takes its share. So progress is one number, the
count of indices consumed, and a world of any size can continue from it.

That number is part of the training state: inside ``@elastic.run`` the sampler binds to
the running ``State``, records progress when the state commits, and finds it again after
a re-form (when the sampler is built anew). ``batches(batch_size, start)`` starts after
``start`` committed steps of the epoch: the state knows how many indices those steps
consumed, even if the world size changed between them.

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


def rank_share(
    offset: int, num_samples: int, batch_size: int, rank: int, size: int
) -> tuple[int, int, int]:
    """The slice ``[lo, hi)`` of the epoch order that ``rank`` processes in the global step
    starting at ``offset``, and the offset after the step (pure).

    A full step gives each rank ``batch_size`` indices; the epoch's last step splits what is
    left as evenly as possible (some ranks may get none, but every rank takes the step, so
    collectives stay matched)."""
    remaining = num_samples - offset
    step = min(remaining, batch_size * size)
    base, extra = divmod(step, size)
    lo = offset + rank * base + min(rank, extra)
    hi = lo + base + (1 if rank < extra else 0)
    return lo, hi, offset + step


class ElasticSampler:
    """The sample indices of each epoch, shared out among the workers of the round (see
    the module docstring).

    Raises ValueError for a negative ``num_samples``."""

    def __init__(self, num_samples: int, shuffle: bool = True, seed: int = 0):
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, not {num_samples}")
        self.num_samples = int(num_samples)
        self.shuffle = shuffle
        self.seed = seed
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

    def _start_offset(self, batch_size: int, start: int, size: int) -> int:
        """Indices consumed after ``start`` steps: recorded when those steps were committed
        (exact whatever the world sizes were); otherwise extrapolated at the current world
        size from the last recorded step before ``start``."""
        offsets = self._progress()["offsets"]
        if start in offsets:
            return offsets[start]
        known = max(k for k in offsets if k <= start) if any(k <= start for k in offsets) else 0
        base = offsets.get(known, 0)
        return min(self.num_samples, base + (start - known) * batch_size * size)

    def batches(self, batch_size: int, start: int = 0) -> Iterator[np.ndarray]:
        """Yield this rank's index arrays, one per global step, from committed step ``start``.

        Raises ValueError for a batch size below 1."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        rank, size = context.rank(), context.size()
        order = epoch_order(self.num_samples, self.epoch, self.shuffle, self.seed)
        progress = self._progress()
        offset = self._start_offset(batch_size, start, size)
        for steps in [k for k in progress["offsets"] if k > start]:
            del progress["offsets"][steps]  # never committed from where we resume
        progress["offsets"][start] = offset
        state = self._state
        if state is not None:
            state._pending_progress = (progress, [])
        steps_done = start
        while offset < self.num_samples:
            lo, hi, after = rank_share(offset, self.num_samples, batch_size, rank, size)
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
