"""The worker's client of the parameter-server shards (contract: docs/DESIGN.md).

    client = elastic.ps.connect()          # under elastic-run --num-ps N
    client.init({"w": w0, "b": b0}, optimizer="adam", lr=1e-3)
    params = client.pull()
    step = client.push({"w": gw, "b": gb})

Every operation talks to all shards in parallel. A shard that is down, restarting or
restoring is retried (its address re-read from the store) for
``ClientSettings.retry_deadline`` seconds, so a worker sees a pause; past it
``PSUnavailableError`` is raised. A shard that lost its variables (restarted without
a checkpoint) gets them re-created from this client's ``init`` values, by the call
that found it out, on that shard alone: a call on the shards' fan-out never fans out
again (``fanout.py``).

Sync mode: ``push`` sends ``(round, size, rank, step, generation)`` and returns once
the step is applied. It raises ``PSRoundChangedError`` (a ``HostsUpdatedInterrupt``)
when a newer round drops the step; when the shards rolled back to a checkpoint it
returns the restored step without applying anything (pull again and go on).
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Protocol, TypeVar

import numpy as np

from ps import wire
from ps.client.create import CreateRequest, create_requests
from ps.client.fanout import Fanout
from ps.client.link import LinkSettings, ShardLink, where
from ps.client.rounds import RoundSource, RoundTracker
from ps.client.sync import sync_step
from ps.errors import (
    RETRYABLE,
    PSConfigError,
    PSShapeError,
    PSUnavailableError,
    PSUninitializedError,
)
from ps.memory import tune_malloc
from ps.optimizers import make_optimizer
from ps.partition import Slice
from ps.protocol import (
    ROLLED_BACK,
    Description,
    PullArgs,
    Pulled,
    PushArgs,
    Record,
    StepArgs,
    StepReply,
)
from ps.settings import ClientSettings
from rendezvous.errors import RendezvousError, StaleIncarnationError
from rendezvous.retry import Backoff
from rendezvous.schema.ps import ShardInfo

log = logging.getLogger("ps.client.client")


class _Progress(Protocol):
    """A shard reply that says where the shard is (step, and history)."""

    @property
    def step(self) -> int: ...

    @property
    def generation(self) -> str: ...


T = TypeVar("T")


class PSClient:
    """A client of shards ``addresses`` (index order): each its record (address and the
    incarnation of its process, which every call's proof is made for), or an address
    alone (the incarnation is then asked of the shard: a shard run without a store).

    ``resolver(index)`` re-reads a shard's record after a failure (a restarted shard
    has a new port, or refuses a proof made for the process before it). Sync mode:
    ``round_source()`` gives this worker's current ``(round_id, size, rank)`` and
    ``newer_round(round_id)`` says whether a newer round was published; without them
    the round is what ``set_round`` set, by default ``(0, 1, 0)``: a worker alone.
    Raises PSConfigError for no addresses."""

    def __init__(
        self,
        addresses: Sequence[str | ShardInfo],
        secret: str,
        settings: ClientSettings | None = None,
        resolver: Callable[[int], ShardInfo | str | None] | None = None,
        round_source: RoundSource | None = None,
        newer_round: Callable[[int], bool] | None = None,
        on_close: Sequence[Callable[[], None]] = (),
    ):
        if not addresses:
            raise PSConfigError("PSClient needs at least one shard address")
        self.settings = settings or ClientSettings()
        if self.settings.tune_malloc:
            tune_malloc()
        self._secret = secret
        self._n = len(addresses)
        self._resolver = resolver
        self._rounds = RoundTracker(round_source, newer_round)
        self._on_close = list(on_close)
        self._lock = threading.Lock()  # client fields below
        self._push_lock = threading.Lock()  # pushes in order: the seq numbers dedupe retries
        self._shards = Fanout(self._n, "ps-shard")  # one call per shard (``_each``)
        self._part_pool = ThreadPoolExecutor(
            self._n * self.settings.lanes, thread_name_prefix="ps-part"
        )
        self._closed = threading.Event()  # also cuts retry pauses short
        self._links = [self._new_link(i, a) for i, a in enumerate(addresses)]
        self._client_id = uuid.uuid4().hex
        self._seq = 0
        self._layout: dict[str, tuple[Slice, ...]] = {}
        self._threshold: int | None = None
        self._mode: str | None = None
        self._step = 0
        self._generation: str | None = None
        self._init_values: dict[str, tuple[np.ndarray, dict]] = {}

    # ------------------------------------------------------------ plumbing
    def _new_link(self, index: int, target: str | ShardInfo) -> ShardLink:
        address, incarnation = where(target)
        s = self.settings
        link = LinkSettings(s.lanes, s.chunk_bytes, s.call_timeout)
        return ShardLink(
            index, address, self._secret, link, pool=self._part_pool, incarnation=incarnation
        )

    def _refresh(self, index: int) -> bool:
        """Re-read shard ``index``'s record; True when it names another process than
        the link had (a new link replaces it)."""
        if self._resolver is None:
            return False
        try:
            found = self._resolver(index)
        except RendezvousError as exc:
            log.debug("cannot re-read the address of shard %d: %s", index, exc)
            return False
        if not found:
            return False
        address, incarnation = where(found)
        with self._lock:
            old = self._links[index]
            if (address, incarnation) == (old.address, old.incarnation):
                return False
            log.info(
                "ps shard %d is at %s (incarnation %s), was at %s",
                index,
                address,
                incarnation,
                old.address,
            )
            self._links[index] = self._new_link(index, found)
            old.close()
        return True

    def _retry(self, index: int, fn):
        """``fn(link)`` on shard ``index``, retried while the shard is unreachable or
        not ready. Raises PSUnavailableError past the retry deadline or once closed."""
        backoff = self._backoff()
        while not self._closed.is_set():
            link = self._links[index]
            try:
                return fn(link)
            except RETRYABLE as exc:
                last = exc
            # A shard that refused the proof as made for the process before it restarted
            # in place and serves: when its record names it already, go again at once.
            stale = isinstance(last, StaleIncarnationError)
            if stale and not backoff.expired() and self._refresh(index):
                continue
            if not backoff.pause():  # backoff while the shard restarts
                if self._closed.is_set():
                    break
                raise PSUnavailableError(
                    f"ps shard {index} (last at {link.address}) did not answer "
                    f"within {self.settings.retry_deadline:.0f}s: {last}"
                ) from last
            self._refresh(index)
        raise PSUnavailableError("the ps client is closed")

    def _backoff(self) -> Backoff:
        """The retry schedule of one operation, ending at its retry deadline or at close."""
        s = self.settings
        return Backoff.within(
            s.retry_deadline, initial=s.backoff_initial, cap=s.backoff_max, stop=self._closed
        )

    def _each(self, fn: Callable[[int], T], indices: Iterable[int] | None = None) -> dict[int, T]:
        """``fn(index)`` for each shard (of ``indices``) in parallel (``Fanout.each``:
        never from inside such a call). Raises the first error of a call."""
        return self._shards.each(fn, range(self._n) if indices is None else indices)

    def _request(
        self,
        index: int,
        method: str,
        args: Record | None = None,
        payload=b"",
        extra_time: float = 0.0,
        sink=None,
    ):
        timeout = self.settings.call_timeout + extra_time
        return self._retry(index, lambda link: link.request(method, args, payload, timeout, sink))

    # ------------------------------------------------------------ layout
    def _describe(self) -> int:
        """Ask every shard for its layout; returns their split threshold.
        Raises PSConfigError when a shard is not the one this client expects there."""
        replies = self._each(lambda i: Description.from_dict(self._request(i, "Describe")[0]))
        layout: dict[str, list[Slice]] = {}
        for i, described in replies.items():
            if described.num_shards != self._n or described.index != i:
                raise PSConfigError(
                    f"shard at index {i} says it is shard {described.index} of "
                    f"{described.num_shards}; this client has {self._n} addresses"
                )
            for variable in described.variables:
                layout.setdefault(variable.slice.name, []).append(variable.slice)
        with self._lock:
            self._layout = {k: tuple(sorted(v, key=lambda s: s.start)) for k, v in layout.items()}
            self._threshold = replies[0].split_threshold
            self._mode = replies[0].mode
            self._note(replies.values())
        return replies[0].split_threshold

    def _note(self, replies: Iterable[_Progress]) -> None:
        """Track step and generation from shard replies (caller holds ``_lock``)."""
        replies = list(replies)
        if replies:
            steps = [r.step for r in replies]
            self._step = min(steps) if self._mode == "sync" else max(steps)
        gens = {r.generation for r in replies}
        if len(gens) == 1:
            self._generation = gens.pop()

    def _ensure_layout(self) -> int:
        """The shards' split threshold, asking them for their layout the first time."""
        threshold = self._threshold
        return threshold if threshold is not None else self._describe()

    def _known(self, names) -> None:
        missing = [n for n in names if n not in self._layout]
        if missing:
            self._describe()
            missing = [n for n in names if n not in self._layout]
            if missing:
                raise PSUninitializedError(
                    f"no variable(s) {missing} on the shards; call init() first"
                )

    # ------------------------------------------------------------ init
    def init(
        self,
        params: Mapping[str, np.ndarray],
        optimizer: str = "sgd",
        lr: float = 0.01,
        **optimizer_args,
    ) -> None:
        """Create the variables that do not exist yet, with this optimizer (variables
        that exist keep their values, optimizer and slots). Raises PSConfigError for a
        bad optimizer, PSShapeError for a dtype that cannot travel or a variable that
        exists with another shape, PSUnavailableError."""
        config = make_optimizer(optimizer, lr, **optimizer_args).config()
        values = {}
        for name, value in params.items():
            array = np.array(value, copy=True)  # kept to re-create lost variables later
            wire.check_dtype(array.dtype)
            values[str(name)] = (array, config)
        threshold = self._ensure_layout()
        with self._lock:
            self._init_values.update(values)
        requests = create_requests(values, self._n, threshold)
        self._each(lambda i: self._create_on(i, requests[i]), sorted(requests))
        self._describe()

    def _create_on(self, index: int, requests: list[CreateRequest]) -> None:
        """Send shard ``index`` its ``Create`` requests, in this thread: on that shard
        alone, so it may run as a call of ``_each`` (``_recreate``)."""
        for args, payload in requests:
            self._request(index, "Create", args, payload)

    def _recreate(self, index: int) -> None:
        """Re-create on shard ``index`` what this client's ``init`` made (the shard lost
        it), from a call of ``_each`` on that shard: nothing here fans out (the layout
        is known since ``init``). Raises the PSUninitializedError it is recovering from
        when there is nothing."""
        with self._lock:
            values, threshold = dict(self._init_values), self._threshold
        if not values or threshold is None:
            raise PSUninitializedError(
                f"ps shard {index} lost its variables and this client "
                f"has no init() values to re-create them"
            )
        log.warning("ps shard %d lost its variables; re-creating them from init()", index)
        requests = create_requests(values, self._n, threshold, only=index)
        self._create_on(index, requests.get(index, []))

    def _with_recreate(self, index: int, fn):
        """``fn()``, re-creating the variables of shard ``index`` while it says it lost
        them, until the retry deadline. Raises what ``fn`` raises."""
        backoff = self._backoff()
        while True:
            try:
                return fn()
            except PSUninitializedError:
                if backoff.expired():
                    raise
                self._recreate(index)

    # ------------------------------------------------------------ pull
    def pull(self, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """The current values (all variables when ``names`` is None), as new writable
        arrays. Raises PSUninitializedError for an unknown name, PSUnavailableError."""
        self._ensure_layout()
        wanted = list(self._layout) if names is None else [str(n) for n in names]
        self._known(wanted)
        with self._lock:
            layout = {n: self._layout[n] for n in wanted}
        on_shard: dict[int, list[str]] = {i: [] for i in range(self._n)} if names is None else {}
        for name, slices in layout.items():
            for sl in slices:
                on_shard.setdefault(sl.shard, []).append(name)
        # every shard writes its slices straight into these (no assembly copy)
        out = {n: np.empty(sl[0].full_shape, np.dtype(sl[0].dtype)) for n, sl in layout.items()}
        backoff = self._backoff()
        while True:
            replies: dict[int, Pulled] = self._each(
                lambda i: self._with_recreate(i, lambda: self._pull_one(i, on_shard[i], out)),
                sorted(on_shard),
            )
            gens = {pulled.generation for pulled in replies.values()}
            # sync: every slice must come from one history (a rollback may be under way)
            if self._mode != "sync" or len(gens) <= 1:
                break
            if not backoff.pause(clip=True):
                raise PSUnavailableError(
                    f"the ps shards stayed in different generations {sorted(gens)} for "
                    f"{self.settings.retry_deadline:.0f}s (a rollback did not finish)"
                )
        with self._lock:
            self._note(replies.values())
        return out

    @staticmethod
    def _destinations(metas: list[dict], out: dict[str, np.ndarray]) -> list[memoryview]:
        """Where each tensor of a pull reply goes, in order: the bytes of its slice of
        ``out``. Raises PSShapeError when a slice does not fit the variable known here."""
        destinations = []
        for meta in metas:
            sl = Slice.from_dict(meta)
            full = out.get(sl.name)
            if full is None or full.shape != sl.full_shape or full.dtype != np.dtype(meta["dtype"]):
                raise PSShapeError(
                    f"shard sent {sl.name!r} as {meta['dtype']} {sl.full_shape}, "
                    f"expected {None if full is None else (full.dtype, full.shape)}"
                )
            dest = sl.take(full).reshape(-1).view(np.uint8).data
            if dest.nbytes != int(meta["nbytes"]):
                raise PSShapeError(
                    f"slice of {sl.name!r} has {meta['nbytes']} bytes, expected {dest.nbytes}"
                )
            destinations.append(dest)
        return destinations

    def _pull_one(self, index: int, names: list[str], out: dict[str, np.ndarray]) -> Pulled:
        def sink(header: dict):
            destinations = self._destinations(wire.tensor_metas(header), out)
            return lambda offset, length: wire.cut(destinations, offset, length)

        header, body = self._request(index, "Pull", PullArgs(tuple(names)), sink=sink)
        if body is not None:  # a small reply came inline
            data, pos = memoryview(body).cast("B"), 0
            for view in sink(header)(0, data.nbytes):
                view[:] = data[pos : pos + view.nbytes]
                pos += view.nbytes
        return Pulled.from_dict(header)

    # ------------------------------------------------------------ push
    def _payloads(self, grads: Mapping[str, np.ndarray]) -> dict[int, list]:
        self._ensure_layout()
        self._known(list(grads))
        tensors: dict[int, list] = {i: [] for i in range(self._n)}
        for name, grad in grads.items():
            slices = self._layout[name]
            g = np.asarray(grad)
            if g.shape != slices[0].full_shape:
                raise PSShapeError(
                    f"gradient of {name!r} has shape {g.shape}, the variable {slices[0].full_shape}"
                )
            g = g.astype(np.dtype(slices[0].dtype), copy=False)
            for sl in slices:
                tensors[sl.shard].append(({"name": name}, sl.take(g)))
        # every shard gets the push, even an empty one, so all count the same steps;
        # pieces, not one joined message: each upload part is the only copy
        return {i: wire.encode_parts({}, t) for i, t in tensors.items()}

    def push(self, grads: Mapping[str, np.ndarray]) -> int:
        """Apply ``grads`` with the shards' optimizer; returns the global step after it
        (sync: once the step is applied). Raises PSShapeError, PSUninitializedError,
        PSUnavailableError; sync also PSRoundChangedError and PSTimeoutError."""
        payloads = self._payloads(grads)
        with self._push_lock:
            if self._mode == "sync":
                return self._push_sync(payloads)
            self._seq += 1
            round_id = self._rounds.current()[0] if self._rounds.follows_a_job else -1
            args = PushArgs(self._client_id, self._seq, round_id)
            replies: dict[int, StepReply] = self._each(
                lambda i: self._with_recreate(
                    i, lambda: StepReply.from_dict(self._request(i, "Push", args, payloads[i])[0])
                )
            )
            with self._lock:
                self._note(replies.values())
                return self._step

    def set_round(self, round_id: int, size: int, rank: int) -> None:
        """Sync mode: this worker is ``rank`` of ``size`` in round ``round_id`` (the
        elastic runtime calls this after each re-form). Raises PSConfigError."""
        self._rounds.set(round_id, size, rank)

    def _step_call(self, args: StepArgs, index: int, method: str, payload) -> StepReply:
        """One sync ``Push`` or ``WaitStep`` long-poll on shard ``index`` (retried)."""
        extra = self.settings.poll_interval
        return self._with_recreate(
            index,
            lambda: StepReply.from_dict(self._request(index, method, args, payload, extra)[0]),
        )

    def _push_sync(self, payloads: dict[int, list]) -> int:
        round_id, size, rank = self._rounds.current()
        with self._lock:
            step, generation = self._step + 1, self._generation
        args = StepArgs(round_id, size, rank, step, str(generation), self.settings.poll_interval)
        replies = sync_step(
            args,
            payloads,
            functools.partial(self._step_call, args),
            self._each,
            self._rounds.moved,
            self.settings.sync_timeout,
        )
        with self._lock:
            rolled = [r for r in replies if r.status == ROLLED_BACK]
            if rolled:
                log.warning(
                    "the ps shards rolled back to step %d; step %d was not applied",
                    min(r.step for r in rolled),
                    step,
                )
                self._note(rolled)
            else:
                self._note(replies)
            return self._step

    @property
    def step(self) -> int:
        """The latest global step this client has seen."""
        return self._step

    @property
    def num_shards(self) -> int:
        return self._n

    def close(self) -> None:
        """Release connections and threads (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._shards.shutdown()
        self._part_pool.shutdown(wait=True)
        for link in self._links:
            link.close()
        for fn in self._on_close:
            try:
                fn()
            except Exception:
                log.debug("close hook failed", exc_info=True)

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
