"""``GradientReducer``: averages (or sums) gradients over the world in fused buckets,
started from backward hooks while backward still runs.

Each parameter has a post-accumulate-grad hook. When every parameter of a bucket has
had its gradient accumulated ``backward_passes_per_step`` times, the bucket is ready;
ready buckets are launched strictly in bucket order (bucket ``k`` never before bucket
``k-1``), so every rank submits the same collectives in the same order whatever order
its hooks fire in. A launched bucket goes to the communication thread, which packs
the gradients into the bucket's flat buffer and allreduces it, overlapping the rest of
backward. ``synchronize()`` launches the buckets still waiting (their parameters got
no gradient this step: they contribute zeros, on every rank alike), waits for all of
them, and points each ``param.grad`` at its slice of the result (no copy out for CPU
tensors without compression).

Parameters without a gradient. A bucket waits only for the parameters that had a
gradient in this rank's previous step (all of them in the first step), so a layer the
model does not use does not hold back every bucket after it. Whichever parameters a
bucket did not wait for contribute zeros. If one of them gets a gradient after all
("late": its bucket was already on its way), ``synchronize()`` reduces those gradients
once more and adds them. Whether that is needed is agreed through a per-parameter
"late" mask that rides in the last bucket's fused message (the last bucket is always
launched by ``synchronize()``), so every rank runs the same collectives and a step
costs no extra collective when nothing is late.

A failed collective (a lost worker) is raised by ``synchronize()``, after every
launched bucket has finished or failed, and the step's bookkeeping is reset.

The plane (``elastic.torch.plane``). On the ring, the communication thread runs each
bucket's allreduce to its end. On a round's process group (NCCL for CUDA gradients by
default, or gloo), it packs the bucket into a buffer of the group's device, starts the
allreduce and returns: the collectives queue on the group while backward goes on, and
``synchronize()`` waits for them (a bucket's ``finished`` time is then when it was seen
done). Those buffers belong to the round's group and are made anew for the next one,
and results are copied into ``param.grad``, never shared with it: an abandoned
collective of a lost round may still write into its buffers (``plane.group``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from elastic.torch import _backend, plane
from elastic.torch._staging import default_staging
from elastic.torch.buckets import Bucket, ParamSpec, plan_buckets
from elastic.torch.plane import PendingCollective, RoundGroup

OPS = ("average", "sum")
COMPRESSIONS = (None, "none", "fp16")


@dataclass
class StepTimeline:
    """When things happened in one step (``clock`` seconds): for the overlap test and
    the benchmark's share of communication hidden behind backward."""

    first_hook: float | None = None
    last_hook: float | None = None
    launched: dict[int, float] = field(default_factory=dict)  # bucket -> handed over
    started: dict[int, float] = field(default_factory=dict)  # bucket -> collective began
    finished: dict[int, float] = field(default_factory=dict)  # bucket -> collective ended
    wait_started: float | None = None  # synchronize() called
    wait_finished: float | None = None

    def hidden_fraction(self) -> float | None:
        """Share of the collectives' time that passed before ``synchronize()`` was
        called (hidden behind backward and the rest of the step); None without any."""
        if self.wait_started is None or not self.finished:
            return None
        total = hidden = 0.0
        for bucket, end in self.finished.items():
            begin = self.started[bucket]
            total += end - begin
            hidden += max(0.0, min(end, self.wait_started) - begin)
        return hidden / total if total > 0 else None


@dataclass
class BucketResult:
    """A bucket's reduced messages (one tensor per large gradient, then the fused small
    ones), the reduced late gradients as (parameter index, tensor) pairs, and the
    collectives still running on a process group (``synchronize()`` waits for them)."""

    tensors: list[torch.Tensor]
    corrections: list[tuple[int, torch.Tensor]]
    pending: list[PendingCollective] = field(default_factory=list)
    shared: bool = True  # the tensors may become ``param.grad`` as they are (the ring's)


class GradientReducer:
    """Reduces the gradients of ``params`` (registration order) every step; see the
    module docstring.

    Raises ValueError for an unknown ``op`` or ``compression`` or a
    ``backward_passes_per_step`` below 1."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        op: str = "average",
        backward_passes_per_step: int = 1,
        compression: str | None = None,
        bucket_bytes: int | None = None,
        first_bucket_bytes: int | None = None,
        comm=None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, not {op!r}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be None or 'fp16', not {compression!r}")
        if backward_passes_per_step < 1:
            raise ValueError(
                f"backward_passes_per_step must be >= 1, not {backward_passes_per_step}"
            )
        self.params = params
        self.op = op
        self.passes = backward_passes_per_step
        self.fp16 = compression == "fp16"
        self._comm = comm or _backend.comm_thread()
        self._clock = clock
        specs = [ParamSpec(p.numel(), p.element_size(), f"{p.dtype}@{p.device}") for p in params]
        kwargs = {}
        if bucket_bytes is not None:
            kwargs["bucket_bytes"] = bucket_bytes
        if first_bucket_bytes is not None:
            kwargs["first_bucket_bytes"] = first_bucket_bytes
        self.buckets: list[Bucket] = plan_buckets(specs, **kwargs)
        self._bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket.params}
        self._flat: dict[tuple, torch.Tensor] = {}  # packing buffers (made once)
        self._group_flat: dict[tuple, torch.Tensor] = {}  # a round group's (made per round)
        self._flat_group: RoundGroup | None = None  # the group ``_group_flat`` belongs to
        self._expected = [True] * len(params)  # had a gradient in the previous step
        self.timeline = StepTimeline()
        self.last_timeline: StepTimeline | None = None  # of the last synchronized step
        self._lock = threading.Lock()
        self._hooks = [
            p.register_post_accumulate_grad_hook(partial(self._on_grad, i))
            for i, p in enumerate(params)
        ]
        self._clear()

    # ---- per-step bookkeeping ----
    def _clear(self) -> None:
        n = len(self.buckets)
        self._counts = [0] * len(self.params)
        self._waiting = [sum(self._expected[i] for i in b.params) for b in self.buckets]
        self._packed: list[tuple[bool, ...] | None] = [None] * n  # which grads each took
        self._next = 0  # the next bucket to launch
        self._futures: list[Future | None] = [None] * n
        self._synced = False
        if self.timeline.wait_finished is not None:
            self.last_timeline = self.timeline
        self.timeline = StepTimeline()

    @property
    def in_step(self) -> bool:
        """True between the first gradient of a step and the step's end."""
        return self._next > 0 or any(self._counts)

    @property
    def synchronized(self) -> bool:
        return self._synced

    def set_passes(self, passes: int) -> None:
        """Accumulate ``passes`` backward passes per step from the next step on (a
        global batch's step may have fewer micro-batches than the last).

        Raises ValueError below 1, RuntimeError within a step."""
        if passes < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, not {passes}")
        with self._lock:
            if self.in_step:
                raise RuntimeError(
                    "backward_passes_per_step changed within a step; set it before its "
                    "first backward()"
                )
            self.passes = int(passes)

    def _on_grad(self, index: int, param: torch.Tensor) -> None:
        now = self._clock()
        with self._lock:
            if self._synced:
                raise RuntimeError(
                    "a gradient was computed after synchronize() and before "
                    "step(); call step() (or reset_step()) first"
                )
            count = self._counts[index] + 1
            if count > self.passes:
                raise RuntimeError(
                    f"gradients computed {count} times before step(), more than "
                    f"backward_passes_per_step={self.passes}; call step() after every "
                    f"{self.passes} backward pass(es), or raise backward_passes_per_step"
                )
            self._counts[index] = count
            timeline = self.timeline
            if timeline.first_hook is None:
                timeline.first_hook = now
            timeline.last_hook = now
            if count == self.passes and self._expected[index]:
                self._waiting[self._bucket_of[index]] -= 1
                # The last bucket is left to synchronize(): it carries the "late" mask.
                while self._next < len(self.buckets) - 1 and self._waiting[self._next] == 0:
                    self._launch(self._next)

    def _launch(self, bucket: int, final: bool = False, late: list[int] | None = None) -> None:
        """Hand ``bucket`` to the communication thread (caller holds the lock). The
        gradients it takes are fixed now: those complete for this step (while backward
        may still run), or every one computed at all (``final``: backward is over).
        ``late`` (the last bucket only): this rank's late gradients."""
        self.timeline.launched[bucket] = self._clock()
        done = 1 if final else self.passes
        packed = tuple(self._counts[i] >= done for i in self.buckets[bucket].params)
        self._packed[bucket] = packed
        self._futures[bucket] = self._comm.submit(
            partial(self._reduce, bucket, packed, self.timeline, late)
        )
        self._next = bucket + 1

    # ---- on the communication thread ----
    def _buffer(self, key: tuple, numel: int, like: torch.Tensor) -> torch.Tensor:
        """A reusable flat host buffer of the wire dtype (made once per ``key``)."""
        flat = self._flat.get(key)
        if flat is None:
            dtype = torch.float16 if self.fp16 else like.dtype
            host = default_staging()
            if host.needs_staging(like):
                flat = host.buffer((numel,), dtype, slot=hash(key))
            else:
                flat = torch.empty(numel, dtype=dtype)
            self._flat[key] = flat
        return flat

    def _alone_input(self, index: int, take: bool) -> np.ndarray:
        """One large gradient as a flat host array: the gradient itself when it is a
        contiguous CPU tensor of the wire dtype (no copy), else a staged copy."""
        param = self.params[index]
        grad = param.grad if take else None
        if (
            grad is not None
            and not self.fp16
            and grad.device.type == "cpu"
            and grad.is_contiguous()
        ):
            return grad.detach().reshape(-1).numpy()
        flat = self._buffer(("alone", index), param.numel(), param)
        with torch.no_grad():
            if grad is None:
                flat.zero_()
            else:
                flat.copy_(grad.detach().reshape(-1))
        return flat.numpy()

    def _fused_input(
        self, bucket: int, took: dict[int, bool], late: list[int] | None
    ) -> np.ndarray:
        """The bucket's small gradients packed into its flat buffer (zeros for those
        not taken), followed by the "late" mask when ``late`` is given."""
        spec = self.buckets[bucket]
        tail = len(self.params) if late is not None else 0
        like = self.params[(spec.fused or spec.params)[0]]
        flat = self._buffer(("fused", bucket), spec.numel + tail, like)
        with torch.no_grad():
            if late is not None:
                mask = flat[spec.numel :]
                mask.zero_()
                mask[late] = 1.0
            for index, offset in zip(spec.fused, spec.offsets):
                param = self.params[index]
                part = flat[offset : offset + param.numel()]
                if not took[index] or param.grad is None:
                    part.zero_()
                else:
                    part.copy_(param.grad.detach().reshape(-1))
        return flat.numpy()

    def _reduce(
        self,
        bucket: int,
        packed: tuple[bool, ...],
        timeline: StepTimeline,
        late: list[int] | None = None,
    ) -> BucketResult | None:
        """The bucket's messages reduced: one per large gradient, then one for the
        fused small ones (the order of ``_unpack``); with ``late`` (the last bucket),
        also the reduced late gradients. None in a world of one."""
        if _backend.world_size() == 1:
            return None  # a world of one: the gradients are the result
        spec = self.buckets[bucket]
        took = dict(zip(spec.params, packed))
        group = plane.group_for(self.params[spec.params[0]].device.type)
        if group is not None:
            return self._reduce_on_group(group, bucket, took, timeline, late)
        timeline.started[bucket] = self._clock()
        results = [
            _backend.allreduce_array(self._alone_input(i, took[i]), self.op) for i in spec.alone
        ]
        if spec.fused or late is not None:
            results.append(_backend.allreduce_array(self._fused_input(bucket, took, late), self.op))
        corrections = []
        if late is not None:
            mask = results[-1][spec.numel :]
            corrections = self._late(late, np.flatnonzero(mask).tolist())
        timeline.finished[bucket] = self._clock()
        return BucketResult([torch.from_numpy(a) for a in results], corrections)

    def _reduce_on_group(
        self,
        group: RoundGroup,
        bucket: int,
        took: dict[int, bool],
        timeline: StepTimeline,
        late: list[int] | None,
    ) -> BucketResult:
        """``_reduce`` on a round's process group: the collectives are started, not
        waited for, but for the last bucket's (its "late" mask decides what follows)."""
        if self._flat_group is not group:  # a new round: buffers of its own
            self._group_flat, self._flat_group = {}, group
        spec = self.buckets[bucket]
        like = self.params[spec.params[0]]
        flats = [self._group_input(group, ("alone", i), [i], like, took) for i in spec.alone]
        if spec.fused or late is not None:
            fused = self._group_input(group, ("fused", bucket), spec.fused, like, took, late)
            flats.append(fused)
        timeline.started[bucket] = self._clock()
        pending = [group.start_allreduce(flat, self.op) for flat in flats]
        corrections = []
        if late is not None:
            for collective in pending:
                collective.wait()
            mask = flats[-1][spec.numel :]
            corrections = self._late(late, torch.nonzero(mask).flatten().tolist(), group)
        return BucketResult(flats, corrections, pending, shared=False)

    def _group_input(
        self,
        group: RoundGroup,
        key: tuple,
        members: tuple[int, ...] | list[int],
        like: torch.Tensor,
        took: dict[int, bool],
        late: list[int] | None = None,
    ) -> torch.Tensor:
        """``members``' gradients packed into the group's buffer ``key`` on its device
        (zeros for those not taken), then the "late" mask when ``late`` is given."""
        sizes = [self.params[i].numel() for i in members]
        tail = len(self.params) if late is not None else 0
        flat = self._group_flat.get(key)
        if flat is None:
            dtype = torch.float16 if self.fp16 else like.dtype
            flat = torch.empty(sum(sizes) + tail, dtype=dtype, device=group.backend.device())
            self._group_flat[key] = flat
        offset = 0
        with torch.no_grad():
            for index, numel in zip(members, sizes):
                part, grad = flat[offset : offset + numel], self.params[index].grad
                if not took[index] or grad is None:
                    part.zero_()
                else:
                    part.copy_(grad.detach().reshape(-1))
                offset += numel
            if late is not None:
                mask = flat[offset:]
                mask.zero_()
                mask[late] = 1.0
        return flat

    # ---- on the training thread ----
    def synchronize(self) -> None:
        """Finish this step's reduction (once per step; later calls return at once).

        Raises WorkerLostError (or another collective error) when a bucket failed."""
        with self._lock:
            if self._synced:
                return
            self.timeline.wait_started = self._clock()
            last = len(self.buckets) - 1
            while self._next < last:
                self._launch(self._next, final=True)
            late = [
                index
                for b, bucket in enumerate(self.buckets[:last])
                for index, took in zip(bucket.params, self._packed[b] or ())
                if not took and self._counts[index] > 0
            ]
            self._launch(last, final=True, late=late)
            futures = list(self._futures)
        results, error = self._wait(futures)
        for bucket, result in enumerate(results):
            error = self._finish(bucket, result) or error
        if error is not None:
            with self._lock:
                self._clear()
            raise error
        for bucket, result in enumerate(results):
            if result is not None:
                self._unpack(bucket, result.tensors, result.shared)
        for index, total in results[-1].corrections if results[-1] is not None else ():
            param = self.params[index]
            param.grad.add_(total.view(param.shape).to(param.grad.device, param.grad.dtype))
        with self._lock:
            self._expected = [count > 0 for count in self._counts]
            self.timeline.wait_finished = self._clock()
            self._synced = True

    def _finish(self, bucket: int, result: BucketResult | None) -> BaseException | None:
        """Wait for ``result``'s collectives still running on a group (all of them, even
        after one failed); the first error, or None."""
        error = None
        for collective in result.pending if result is not None else ():
            try:
                collective.wait()
            except BaseException as exc:  # noqa: BLE001 - synchronize() re-raises the first
                error = error or exc
        if result is not None and result.pending:
            self.timeline.finished[bucket] = self._clock()
        return error

    def _late(
        self, late: list[int], anywhere: list[int], group: RoundGroup | None = None
    ) -> list[tuple[int, torch.Tensor]]:
        """On the communication thread: reduce the gradients that came after their
        bucket left on some rank (``anywhere``, agreed by the mask; zeros from ranks
        where they were on time), on the ring or on ``group``. Returns (parameter
        index, reduced gradient) pairs."""
        mine = set(late)
        reduced = []
        device = group.backend.device() if group is not None else torch.device("cpu")
        for index in anywhere:
            param = self.params[index]
            grad = param.grad if index in mine and param.grad is not None else None
            local = (
                # A group reduces in place (its own copy); the ring returns a new array
                grad.detach().reshape(-1).to(device, copy=group is not None)
                if grad is not None
                else torch.zeros(param.numel(), dtype=param.dtype, device=device)
            ).contiguous()
            if group is not None:
                group.start_allreduce(local, self.op).wait()
                reduced.append((index, local))
                continue
            total = torch.from_numpy(_backend.allreduce_array(local.numpy(), self.op))
            reduced.append((index, total))
        return reduced

    @staticmethod
    def _wait(futures: list[Future | None]) -> tuple[list, BaseException | None]:
        results, error = [], None
        for future in futures:
            try:
                results.append(future.result() if future is not None else None)
            except BaseException as exc:  # noqa: BLE001 - the caller re-raises the first
                results.append(None)
                error = error or exc
        return results, error

    def _unpack(self, bucket: int, results: list[torch.Tensor], shared: bool = True) -> None:
        """Point or copy each gradient of ``bucket`` at its reduced values; ``shared``:
        the results may become ``param.grad`` as they are (a group's may not)."""
        spec = self.buckets[bucket]
        places = [(index, results[k], 0) for k, index in enumerate(spec.alone)]
        places += [(index, results[-1], offset) for index, offset in zip(spec.fused, spec.offsets)]
        with torch.no_grad():
            for index, result, offset in places:
                param = self.params[index]
                view = result[offset : offset + param.numel()].view(param.shape)
                if shared and view.dtype == param.dtype and param.device.type == "cpu":
                    param.grad = view  # shares the transport's result: no copy
                elif param.grad is None:
                    param.grad = view.to(device=param.device, dtype=param.dtype, copy=True)
                else:
                    param.grad.copy_(view)

    def end_step(self) -> None:
        """Start counting the next step (after ``optimizer.step()``): waits for any
        launched bucket so that none still reads gradients."""
        with self._lock:
            futures = list(self._futures)
        self._wait(futures)
        with self._lock:
            self._clear()

    def reset_step(self) -> None:
        """Forget the step in flight (a failure cut it short): waits for launched
        buckets to finish or fail, drops their results, and starts counting anew."""
        self.end_step()

    def remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
