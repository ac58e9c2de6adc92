"""``ElasticSampler`` for a ``torch.utils.data.DataLoader``: each sample of an epoch is
processed exactly once across re-forms, whatever the world size does.

An epoch is a fixed permutation of the dataset's indices (seeded by ``seed`` and the
epoch, the same as the numpy sampler's). Progress is one number, the count of positions
of that permutation consumed; committed with the ``TorchState`` the sampler is passed
to, it is restored and synced with it, and iterating after a re-form yields this
worker's share of what is left. The sampler works in one of two modes.

**A constant global batch** (``global_batch_size=B``): every step consumes the next
``B`` positions (the epoch's last step what is left), whatever the world size, split as
evenly as possible among the workers (``elastic.sampler.step_share``); a share larger
than ``max_micro_batch`` is cut into micro-batches. The sampler is then a batch sampler,
``DataLoader(dataset, batch_sampler=sampler)``, and ``steps(loader)`` groups the
loader's micro-batches into steps, each with its weight: the micro-batch's samples over
the step's samples across the world. The weights of a step add up to 1 over the world,
so with each micro-batch's mean loss scaled by its weight and the gradients summed
(``DistributedOptimizer(..., op="sum")``) every update is the one a single process
makes on the same ``B`` samples. A worker whose share of a step is empty (the step has
fewer samples than workers) gets a step without micro-batches: it runs no backward and
its ``optimizer.step()`` contributes zeros. ``steps()`` counts a step as consumed when it
hands it out, so a commit after the step records it.

**A batch size per worker** (the loader's ``batch_size``, without ``global_batch_size``):
after ``record_batch(i, batch_size)`` in a world of ``W`` workers, the first
``start + (i + 1) * W * batch_size`` positions are consumed (``start`` being the
progress when iteration began). That works because each rank takes the positions
congruent to its rank modulo ``W`` of what is left, so global step ``i`` consumes
exactly the next ``W * batch_size`` positions whatever the batch size. The last step of
an epoch splits what is left evenly: every rank gets at least one sample and takes the
same number of steps. One case cannot be met with a DataLoader's fixed batch size: a
last step with fewer samples than workers (``0 < left % (W * B) < W``). Ranks without a
sample then take one of that step's samples again, so every rank still takes the step
with a non-empty batch; it is the only repeat. It never happens when the dataset size
modulo the batch size is 0 or at least the largest world size (every full step
consumes a multiple of ``B``), e.g. 1437 digits in batches of 32. The gradients of such
steps are averaged over ranks, not samples: use a global batch for steps whose update
does not depend on how the world split them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.utils.data

from elastic.sampler import epoch_order, micro_pieces, step_share
from elastic.torch import _backend


def rank_positions(remaining: int, rank: int, size: int, batch_size: int | None) -> np.ndarray:
    """The positions (0-based, within what is left of the epoch) that ``rank`` takes,
    in order, with a batch size per worker (pure).

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


@dataclass(frozen=True)
class StepPlan:
    """One global step of a constant global batch, as one rank sees it."""

    after: int  # positions of the epoch consumed once the step is done
    samples: int  # the step's samples across the world
    pieces: tuple[tuple[int, int], ...]  # this rank's micro-batches: [lo, hi) positions

    @property
    def weights(self) -> list[float]:
        """Each micro-batch's samples over the step's samples across the world."""
        return [(hi - lo) / self.samples for lo, hi in self.pieces]


def plan_steps(
    processed: int,
    num_samples: int,
    global_batch_size: int,
    rank: int,
    size: int,
    max_micro_batch: int | None,
) -> list[StepPlan]:
    """The rest of the epoch from ``processed`` positions on, in steps of
    ``global_batch_size`` (pure)."""
    plans, offset = [], processed
    while offset < num_samples:
        lo, hi, after = step_share(offset, num_samples, global_batch_size, rank, size)
        pieces = tuple((lo + a, lo + b) for a, b in micro_pieces(hi - lo, max_micro_batch))
        plans.append(StepPlan(after, after - offset, pieces))
        offset = after
    return plans


class Step:
    """This worker's part of one global step: iterate it for ``(batch, weight)`` pairs,
    one per micro-batch (none when the share is empty). ``weight`` is the micro-batch's
    samples over the step's samples across the world; scale its mean loss by it."""

    def __init__(self, plan: StepPlan, batches: Iterator[Any]):
        self.weights = plan.weights
        self.samples = sum(hi - lo for lo, hi in plan.pieces)  # this worker's
        self.step_samples = plan.samples  # the world's
        self._batches = batches
        self._taken = 0

    @property
    def weight(self) -> float:
        """This worker's share of the step's samples (0 for an empty share)."""
        return self.samples / self.step_samples

    def __len__(self) -> int:
        return len(self.weights)

    def __iter__(self) -> Iterator[tuple[Any, float]]:
        while self._taken < len(self.weights):
            weight = self.weights[self._taken]
            self._taken += 1
            yield next(self._batches), weight

    def _finish(self) -> None:
        """Skip the micro-batches not taken, so the next step starts at its own."""
        for _ in self:
            pass
        self._release()

    def _release(self) -> None:
        """Let go of the loader's iterator: a step that the loop still names (in a frame
        a traceback keeps, after a failure) must not keep a loader's workers alive."""
        self._batches = iter(())


class ElasticSampler(torch.utils.data.Sampler):
    """A sampler for ``DataLoader`` (see the module docstring for the two modes).

    ``global_batch_size=B``: ``DataLoader(dataset, batch_sampler=sampler)`` and
    ``for step in sampler.steps(loader)``; ``max_micro_batch`` caps a micro-batch.
    Otherwise ``DataLoader(dataset, batch_size=B, sampler=sampler)``,
    ``record_batch(batch_idx, B)`` after each processed batch (``batch_idx`` counted
    from 0 in this iteration of the loader); ``batch_size`` (optional, the loader's)
    lets the first epoch's last step be split evenly, and is learnt from
    ``record_batch`` otherwise. Either way ``set_epoch(e)`` at the start of each epoch,
    and pass the sampler to ``TorchState(sampler=...)``.

    Raises ValueError for a size below 1, a ``batch_size`` together with
    ``global_batch_size``, or a ``max_micro_batch`` without it."""

    def __init__(
        self,
        dataset,
        shuffle: bool = True,
        seed: int = 0,
        batch_size: int | None = None,
        global_batch_size: int | None = None,
        max_micro_batch: int | None = None,
    ):
        self.num_samples = len(dataset)
        for name, value in (
            ("batch_size", batch_size),
            ("global_batch_size", global_batch_size),
            ("max_micro_batch", max_micro_batch),
        ):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, not {value}")
        if global_batch_size is not None and batch_size is not None:
            raise ValueError("give batch_size (per worker) or global_batch_size, not both")
        if max_micro_batch is not None and global_batch_size is None:
            raise ValueError("max_micro_batch needs global_batch_size")
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.batch_size = batch_size
        self.global_batch_size = global_batch_size
        self.max_micro_batch = max_micro_batch
        self.processed = 0  # positions of this epoch's order consumed
        self._start = 0  # progress when the current iteration began
        self._size = 1  # world size of the current iteration
        self._plan: list[StepPlan] = []  # a global batch's steps, made by __iter__
        self._plans_made = 0

    # ---- progress ----
    def set_epoch(self, epoch: int) -> None:
        """Select ``epoch``'s order; progress starts at 0 unless it is the epoch already
        in progress (as after a restore)."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.processed = 0

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count step ``batch_idx`` of this iteration (``batch_size`` per rank) as
        processed. Raises ValueError for a batch size below 1, or with a global batch
        (whose ``steps()`` counts the steps itself)."""
        if self.global_batch_size is not None:
            raise ValueError("with global_batch_size, steps() records the progress")
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

    # ---- a global batch ----
    def _rest_of_epoch(self) -> list[StepPlan]:
        """This rank's steps of a global batch from the current progress."""
        assert self.global_batch_size is not None
        return plan_steps(
            self.processed,
            self.num_samples,
            self.global_batch_size,
            _backend.world_rank(),
            _backend.world_size(),
            self.max_micro_batch,
        )

    def _micro_batches(self, plan: list[StepPlan]) -> list[list[int]]:
        order = epoch_order(self.num_samples, self.epoch, self.shuffle, self.seed)
        return [order[lo:hi].tolist() for step in plan for lo, hi in step.pieces]

    def steps(self, loader: Iterable | None = None, optimizer: Any = None) -> Iterator[Step]:
        """This worker's part of each remaining step of the epoch, drawing the
        micro-batches from ``loader`` (a ``DataLoader`` whose ``batch_sampler`` is this
        sampler), or index lists without one. Every worker gets every step, with or
        without micro-batches. A step counts as consumed once handed out: commit after
        it.

        ``optimizer``: a ``DistributedOptimizer(..., op="sum")``; before each step its
        ``backward_passes_per_step`` is set to the step's micro-batches on this worker
        (at least 1: an empty share runs no backward and its ``step()`` sends zeros), so
        that ``step()`` applies the sum of the weighted gradients of the world, the one
        process's update on the step's samples.

        Raises ValueError without a global batch, when ``loader`` does not draw its
        batches from this sampler, or for an optimizer that is not a
        ``DistributedOptimizer`` summing gradients."""
        if self.global_batch_size is None:
            raise ValueError("steps() needs a sampler with global_batch_size")
        if optimizer is not None and getattr(optimizer, "gradient_op", None) != "sum":
            raise ValueError(
                'steps(optimizer=...) needs DistributedOptimizer(..., op="sum"): the '
                "weights of a step add up to 1 over the world, so the weighted gradients "
                "are summed, not averaged"
            )
        made = self._plans_made
        batches = iter(loader if loader is not None else self)
        if self._plans_made == made:
            raise ValueError(
                "the loader does not draw its batches from this sampler: "
                "DataLoader(dataset, batch_sampler=sampler)"
            )
        step: Step | None = None
        try:
            for plan in self._plan:
                self.processed = plan.after
                step = Step(plan, batches)
                if optimizer is not None:
                    optimizer.backward_passes_per_step = max(1, len(step))
                yield step
                step._finish()
            # Run the loader's iterator to its end (it has no batch left): a DataLoader
            # with worker processes stops them there, not when the iterator is collected
            # (which could be after the next epoch's workers were forked, or at exit).
            for _ in batches:
                raise RuntimeError("the loader yielded more batches than the sampler planned")
        finally:
            # Also when the loop stopped early (a failure, a new round): the loader's
            # iterator then goes with this generator, and its workers with it.
            if step is not None:
                step._release()

    # ---- iteration ----
    def _mine(self) -> np.ndarray:
        rank, size = _backend.world_rank(), _backend.world_size()
        order = epoch_order(self.num_samples, self.epoch, self.shuffle, self.seed)
        rest = order[self.processed :]
        return rest[rank_positions(len(rest), rank, size, self.batch_size)]

    def __iter__(self) -> Iterator[Any]:
        """Sample indices; with a global batch, this worker's micro-batches (index
        lists) of the rest of the epoch, as a batch sampler."""
        if self.global_batch_size is not None:
            # The plan that steps() follows: made here, when the loader starts iterating.
            self._plan = self._rest_of_epoch()
            self._plans_made += 1
            return iter(self._micro_batches(self._plan))
        self._start, self._size = self.processed, _backend.world_size()
        return iter(self._mine().tolist())

    def __len__(self) -> int:
        if self.global_batch_size is not None:
            return sum(len(step.pieces) for step in self._rest_of_epoch())
        return len(self._mine())
