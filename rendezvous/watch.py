"""Following a key prefix of the store from a thread, through outages.

``follow_prefix`` forwards every change under a prefix to ``on_event``. When the watch
ends for good (the store was away longer than the watch waits, or its history was
compacted), it reads the prefix afresh (``on_resync`` gets every key) and watches on
from there, retrying with ``rendezvous.retry.Backoff``; only a store unreachable for
``patience`` seconds ends it (``on_lost``). Used by the job (registrations, failure
reports), by the ps supervisor (shard records, checkpoints), by the agents and by
the workers' snapshots (their requests and parts).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Callable

from rendezvous.errors import RendezvousError
from rendezvous.retry import Backoff
from rendezvous.store import Event, KeyValue, KVStore, Watch

log = logging.getLogger(__name__)

POLL = 0.5
"""Seconds between looks at ``stop`` while the watch is quiet."""


def follow_prefix(
    store: KVStore,
    prefix: str,
    watch: Watch | None,
    *,
    on_event: Callable[[Event], None],
    on_resync: Callable[[Sequence[KeyValue]], None],
    on_lost: Callable[[Exception], None],
    stop: threading.Event,
    patience: float,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Forward changes under ``prefix`` until ``stop`` is set (runs in the caller's
    thread). ``watch`` None: start with a fresh read (``on_resync``). Callbacks run in
    this thread and must not raise. Always cancels the watch before returning."""
    try:
        while not stop.is_set():
            if watch is None:
                watch = _read_and_watch(store, prefix, on_resync, on_lost, stop, patience, clock)
                if watch is None:
                    return
                continue
            try:
                event = watch.get(timeout=POLL)
            except RendezvousError as exc:
                log.warning("watch on %s ended (%s); reading it afresh", prefix, exc)
                watch.cancel()
                watch = None
                continue
            if event is not None:
                on_event(event)
            elif watch.ended:  # its client was closed under it: nothing more will come
                return
    finally:
        if watch is not None:
            watch.cancel()


def _read_and_watch(
    store: KVStore,
    prefix: str,
    on_resync: Callable[[Sequence[KeyValue]], None],
    on_lost: Callable[[Exception], None],
    stop: threading.Event,
    patience: float,
    clock: Callable[[], float],
) -> Watch | None:
    backoff = Backoff.within(patience, initial=0.1, cap=1.0, stop=stop, clock=clock)
    while True:
        try:
            kvs, watch = store.read_and_watch(prefix)
        except RendezvousError as exc:
            if backoff.pause(clip=True):
                continue
            if not stop.is_set():
                on_lost(exc)
            return None
        on_resync(kvs)
        return watch


def follow_in_thread(
    name: str,
    store: KVStore,
    prefix: str,
    *,
    on_event: Callable[[Event], None],
    on_resync: Callable[[Sequence[KeyValue]], None],
    on_lost: Callable[[Exception], None],
    stop: threading.Event,
    patience: float,
    clock: Callable[[], float] = time.monotonic,
) -> threading.Thread:
    """``follow_prefix`` from a fresh read, in a daemon thread called ``name``."""
    thread = threading.Thread(
        target=follow_prefix,
        args=(store, prefix, None),
        kwargs={
            "on_event": on_event,
            "on_resync": on_resync,
            "on_lost": on_lost,
            "stop": stop,
            "patience": patience,
            "clock": clock,
        },
        name=name,
        daemon=True,
    )
    thread.start()
    return thread
