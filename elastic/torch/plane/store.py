"""``RoundStore``: torch.distributed's ``Store`` over the job's own store, under one
round's prefix.

A process group meets its members through a store (gloo exchanges its addresses there,
NCCL its unique id). torchrun puts that store in rank 0, a worker that can die; here it
is the job's store (the driver's embedded store, or etcd), which outlives every worker,
under ``/elastic/<job>/torch/<round>/`` (``JobKeys.torch_group``): a group of round k
never reads a key of round k+1's.

Blocking reads (``get``, ``wait``) look at the store with a short backoff (the members
of a round write their keys within milliseconds of each other) and give up when
``stop()`` says the round is over (a member was lost while the group formed: the
construction raises at once instead of waiting out a timeout) or after ``timeout``.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Callable

import torch.distributed as dist

from rendezvous.store import KVStore

#: first and longest pause between two looks at a key that is not there yet
FIRST_PAUSE = 0.001
LONGEST_PAUSE = 0.02


class RoundStoreStopped(RuntimeError):
    """A blocking read gave up: the round is over (``stop()``) or its time ran out."""


class RoundStore(dist.Store):
    """Keys under ``prefix`` of ``kv``; ``stop()`` (any thread) ends blocking reads;
    ``timeout``: the longest a blocking read waits (seconds)."""

    def __init__(self, kv: KVStore, prefix: str, stop: Callable[[], bool], timeout: float):
        super().__init__()
        self._kv = kv
        self._prefix = prefix
        self._stop = stop
        self._timeout = timeout

    def _key(self, key: str) -> str:
        return f"{self._prefix}{key}"

    def _await(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key`` once it exists.

        Raises RoundStoreStopped when ``stop()`` or the timeout comes first."""
        limit = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        pause = FIRST_PAUSE
        while True:
            kv = self._kv.get(self._key(key))
            if kv is not None:
                return kv.value
            if self._stop():
                raise RoundStoreStopped(f"the round ended while waiting for {key!r}")
            if time.monotonic() + pause > deadline:
                raise RoundStoreStopped(f"no {key!r} in the store after {limit:g} s")
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)

    # ---- torch.distributed.Store ----
    def set(self, key: str, value) -> None:
        self._kv.put(self._key(key), _as_bytes(value))

    def get(self, key: str) -> bytes:
        return self._await(key)

    def add(self, key: str, amount: int) -> int:
        """Atomic: a compare-and-swap on the key's revision, again until it wins."""
        while True:
            kv = self._kv.get(self._key(key))
            value = (int(kv.value) if kv is not None else 0) + int(amount)
            expected = kv.mod_revision if kv is not None else 0
            if self._kv.compare_and_swap(self._key(key), str(value).encode(), expected):
                return value

    def compare_set(self, key: str, expected, desired) -> bytes:
        """``desired`` when the key holds ``expected`` (or is absent and ``expected`` is
        empty), as torch's stores; else the value it holds (``expected`` when absent)."""
        want, new = _as_bytes(expected), _as_bytes(desired)
        while True:
            kv = self._kv.get(self._key(key))
            if kv is None and want:
                return want
            if kv is not None and kv.value != want:
                return kv.value
            revision = kv.mod_revision if kv is not None else 0
            if self._kv.compare_and_swap(self._key(key), new, revision):
                return new

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        seconds = timeout.total_seconds() if timeout is not None else None
        for key in keys:
            self._await(key, seconds)

    def check(self, keys: list[str]) -> bool:
        return all(self._kv.get(self._key(key)) is not None for key in keys)

    def delete_key(self, key: str) -> bool:
        existed = self._kv.get(self._key(key)) is not None
        self._kv.delete(self._key(key))
        return existed

    def num_keys(self) -> int:
        return len(self._kv.get_prefix(self._prefix)[0])


def _as_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
