"""The KV store interface, shaped like etcd v3, that both backends implement.

What a backend provides is small (``_range``, ``_put``, ``_delete``, ``_txn``, the
lease calls, ``_open_watch``); what every caller relies on is built here once:
retries with a deadline through an outage, the value size limit, leases kept alive
by a thread (``rendezvous.lease``, re-exported here: the interface speaks it), and watches that resume from their revision after a reconnect so that
no event is lost or repeated.

Retry rule: a call that failed to *reach* the store (``RendezvousConnectionError``)
is retried until ``StoreSettings.retry_deadline``. Reads, puts and deletes are safe
to repeat. A transaction is only repeated when the failure proves it was never
applied (``NotSentError``); an ambiguous failure (deadline passed after sending)
is raised, because repeating a compare-and-swap that did succeed would report a
loss for what was a win.
"""

from __future__ import annotations

import abc
import logging
import queue
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Callable, cast

from rendezvous.errors import (
    NotSentError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    ValueTooLargeError,
    WatchCompactedError,
)
from rendezvous.lease import Lease
from rendezvous.rate_log import RateLimitedLog
from rendezvous.records import (  # re-exported (__all__): the interface speaks them
    DELETE,
    PUT,
    Compare,
    Delete,
    Event,
    KeyValue,
    Put,
    StoreSettings,
    TxnResult,
    op_from_dict,
)
from rendezvous.signing import RecordSigner, record_kind, split

__all__ = [
    "DELETE",
    "PUT",
    "Compare",
    "Delete",
    "Event",
    "KVStore",
    "KeyValue",
    "Lease",
    "Put",
    "StoreSettings",
    "TxnResult",
    "Watch",
    "op_from_dict",
]

log = logging.getLogger(__name__)

#: seconds between two lines about ignored records of one kind
UNSIGNED_LOG_INTERVAL = 60.0


_WATCH_CLOSED = object()


class Watch:
    """Events under a prefix from a revision on, in order, each once, across reconnects.

    A background thread reads the backend's stream; when it breaks, the thread reopens
    it from the revision after the last event delivered. ``get`` raises the watch's
    terminal error (``WatchCompactedError``, or ``RendezvousConnectionError`` after
    ``watch_reconnect_deadline`` without the store)."""

    def __init__(self, store: KVStore, prefix: str, start_revision: int):
        self.prefix = prefix
        self.next_revision = start_revision
        self._store = store
        self._queue: queue.Queue = queue.Queue()
        self._cancelled = threading.Event()
        self._cancel_stream: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self.reconnects = 0
        self._thread = threading.Thread(target=self._run, name=f"watch{prefix}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = None
        backoff = 0.05
        while not self._cancelled.is_set():
            generation = self._store._endpoint_generation
            try:
                if self._store._closed:
                    raise RendezvousClosedError("store client is closed")
                stream, cancel = self._store._open_watch(self.prefix, self.next_revision)
                with self._lock:
                    self._cancel_stream = cancel
                if self._cancelled.is_set():
                    cancel()
                    break
                for events, progress in stream:
                    deadline, backoff = None, 0.05
                    self._deliver(events, progress)
                if self._cancelled.is_set():
                    break
                raise RendezvousConnectionError("watch stream ended")
            except (WatchCompactedError, RendezvousClosedError) as exc:
                self._queue.put(exc)
                return
            except RendezvousError as exc:
                if self._cancelled.is_set():
                    break
                now = time.monotonic()
                deadline = deadline or now + self._store.settings.watch_reconnect_deadline
                if now > deadline:
                    self._queue.put(
                        RendezvousConnectionError(
                            f"watch on {self.prefix!r} lost its store for more than "
                            f"{self._store.settings.watch_reconnect_deadline:.0f}s: {exc}"
                        )
                    )
                    return
                self.reconnects += 1
                log.debug(
                    "watch %s reconnecting from revision %d: %s",
                    self.prefix,
                    self.next_revision,
                    exc,
                )
                self._store._on_connection_error(generation)
                self._cancelled.wait(backoff)
                backoff = min(backoff * 2, 1.0)
            # The client was closed under us (gRPC raises ValueError).
            except Exception as exc:  # noqa: BLE001
                if not (self._cancelled.is_set() or self._store._closed):
                    self._queue.put(RendezvousError(f"watch on {self.prefix!r} failed: {exc!r}"))
                    return
                break
        self._queue.put(_WATCH_CLOSED)

    def _deliver(self, events: list[Event], progress: int | None) -> None:
        """Queue a batch's events not delivered before. A batch holds whole revisions (a
        transaction's events arrive together), so the floor is where the batch started:
        several events of one revision all pass. ``progress``: the stream has sent every
        event up to that revision (a heartbeat), so a resume may start after it even when
        none of them was ours."""
        floor = self.next_revision
        for ev in events:
            if ev.revision >= floor:  # older ones were delivered before a reconnect
                opened = self._store._opened(ev.kv) if ev.type == PUT else ev.kv
                if opened is not None:  # (a forged write: as if it never happened)
                    self._queue.put(ev if opened is ev.kv else Event(ev.type, opened))
                self.next_revision = max(self.next_revision, ev.revision + 1)
        if progress is not None:
            self.next_revision = max(self.next_revision, progress + 1)

    def get(self, timeout: float | None = None) -> Event | None:
        """The next event, or None when ``timeout`` passes or the watch was cancelled.

        Raises the watch's terminal ``RendezvousError`` (kept, so every later call raises too)."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _WATCH_CLOSED or isinstance(item, Exception):
            self._queue.put(item)  # keep the terminal state for the next caller
            if isinstance(item, Exception):
                raise item
            return None
        return item

    def __iter__(self) -> Iterator[Event]:
        while True:
            ev = self.get()
            if ev is None:
                return
            yield ev

    @property
    def ended(self) -> bool:
        """Cancelled, or its client closed: ``get`` has nothing more to give."""
        return self._cancelled.is_set() or self._store._closed

    def cancel(self) -> None:
        self._cancelled.set()
        with self._lock:
            cancel = self._cancel_stream
        if cancel is not None:
            cancel()
        self._thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cancel()


class KVStore(abc.ABC):
    """A KV store with revisions, transactions, leases and prefix watches (etcd v3 shaped).

    Every method raises a ``RendezvousError`` subclass on failure and returns within
    ``settings.retry_deadline`` (plus one request timeout)."""

    #: URL scheme this backend is chosen by (see ``rendezvous.open_store``)
    scheme: str = ""

    def __init__(self, settings: StoreSettings):
        self.settings = settings
        self._closed = False
        self._watches: weakref.WeakSet[Watch] = weakref.WeakSet()
        #: signs what this client writes and checks what it reads (``rendezvous.signing``);
        #: ``open_store`` sets it from the job's secret
        self.signer: RecordSigner | None = None
        self._unsigned = RateLimitedLog(UNSIGNED_LOG_INTERVAL, log, "records")

    # ---- what a backend implements (one attempt each; raise typed errors) ----
    @abc.abstractmethod
    def _range(self, key: str, prefix: bool) -> tuple[list[KeyValue], int]: ...

    @abc.abstractmethod
    def _txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete],
    ) -> TxnResult: ...

    @abc.abstractmethod
    def _grant(self, ttl: int) -> int: ...

    @abc.abstractmethod
    def _keepalive(self, lease_id: int) -> int: ...

    @abc.abstractmethod
    def _revoke(self, lease_id: int) -> None: ...

    @abc.abstractmethod
    def _open_watch(
        self, prefix: str, start_revision: int
    ) -> tuple[Iterator[tuple[list[Event], int | None]], Callable[[], None]]:
        """A stream of ``(events, progress)`` batches from ``start_revision`` and a function
        that ends it. A batch holds whole revisions; ``progress``, when not None, is a
        revision up to which the stream has sent every event of the prefix. Raises
        WatchCompactedError if that history is gone."""

    #: bumped by a backend each time it moves to another endpoint
    _endpoint_generation = 0

    def _on_connection_error(self, generation: int) -> None:  # noqa: B027 - optional hook
        """A call made at ``generation`` could not reach the store. A multi-endpoint
        backend moves to its next endpoint, unless another thread already did."""

    @abc.abstractmethod
    def _close(self) -> None: ...

    # ---- the interface ----
    def _call(self, fn: Callable, *, repeatable: bool = True, retry: bool = True):
        if self._closed:
            raise RendezvousClosedError("store client is closed")
        deadline = time.monotonic() + self.settings.retry_deadline
        backoff = 0.05
        while True:
            generation = self._endpoint_generation
            try:
                return fn()
            except RendezvousConnectionError as exc:
                if self._closed:
                    raise RendezvousClosedError("store client is closed") from exc
                self._on_connection_error(generation)
                ambiguous = not isinstance(exc, NotSentError)
                if (
                    not retry
                    or (ambiguous and not repeatable)
                    or time.monotonic() + backoff > deadline
                ):
                    raise
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    def _check_value(self, key: str, value: bytes) -> None:
        if not isinstance(value, (bytes, bytearray)):
            raise TypeError(f"value for {key!r} must be bytes, not {type(value).__name__}")
        if len(value) > self.settings.max_value_bytes:
            raise ValueTooLargeError(
                f"value for {key!r} is {len(value)} bytes, above the limit of "
                f"{self.settings.max_value_bytes} bytes"
            )

    def _opened(self, kv: KeyValue) -> KeyValue | None:
        """``kv`` with its value's signature checked and taken off; None (and said, once
        a minute for each kind of record) when it is not the job's. Without a signer (a
        client without the job's secret: an observer, such as a test or a tool) the
        signature is taken off unchecked: etcd hides nothing from who can reach it, and
        what such a client writes is ignored by the job."""
        if self.signer is None:
            body = split(kv.value)[0]
            return kv if body is kv.value else replace(kv, value=body)
        value = self.signer.open(kv.key, kv.value)
        if value is None:
            kind = record_kind(kv.key)
            self._unsigned.warn(
                kind,
                f"ignored the {kind!r} record at {kv.key} (revision {kv.mod_revision}): it "
                "does not carry the job's signature, so a writer without the job's secret "
                "put it there",
            )
            return None
        return replace(kv, value=value)

    def _signed(self, op: Put | Delete) -> Put | Delete:
        if self.signer is None or not isinstance(op, Put):
            return op
        return replace(op, value=self.signer.sign(op.key, op.value))

    def _signed_compare(self, compare: Compare) -> Compare:
        if self.signer is None or compare.target != "value":
            return compare
        return replace(compare, value=self.signer.sign(compare.key, cast(bytes, compare.value)))

    def get(self, key: str) -> KeyValue | None:
        """The value at ``key``, or None (also when it is not signed by the job)."""
        kvs, _ = self._call(lambda: self._range(key, False))
        return self._opened(kvs[0]) if kvs else None

    def get_unchecked(self, key: str) -> bytes | None:
        """The value at ``key`` without its signature, which is not checked: only for a
        diagnosis (``rendezvous.job_secret``), never to act on."""
        kvs, _ = self._call(lambda: self._range(key, False))
        return split(kvs[0].value)[0] if kvs else None

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """All keys under ``prefix`` sorted by key (those signed by the job), and the store
        revision they were read at."""
        kvs, revision = self._call(lambda: self._range(prefix, True))
        opened = [kv for kv in map(self._opened, kvs) if kv is not None]
        return opened, revision

    def revision(self) -> int:
        """The store's current revision."""
        return self._call(lambda: self._range("\0", False))[1]

    def put(self, key: str, value: bytes, lease: int | Lease = 0) -> int:
        """Write ``value``; returns the revision of the write."""
        self._check_value(key, value)
        return self.txn(
            [], [Put(key, bytes(value), _lease_id(lease))], [], _repeatable=True
        ).revision

    def delete(self, key: str) -> int:
        return self.txn([], [Delete(key)], [], _repeatable=True).revision

    def delete_prefix(self, prefix: str) -> int:
        return self.txn([], [Delete(prefix, prefix=True)], [], _repeatable=True).revision

    def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Put | Delete] = (),
        failure: Sequence[Put | Delete] = (),
        _repeatable: bool = False,
    ) -> TxnResult:
        """Apply ``success`` if every compare holds, else ``failure``, atomically at one
        revision. Values put, and those compared, are signed (``signer``)."""
        compares = [self._signed_compare(c) for c in compares]
        success = [self._signed(op) for op in success]
        failure = [self._signed(op) for op in failure]
        for op in (*success, *failure):
            if isinstance(op, Put):
                self._check_value(op.key, op.value)
        return self._call(lambda: self._txn(compares, success, failure), repeatable=_repeatable)

    def compare_and_swap(
        self, key: str, value: bytes, expected_mod_revision: int, lease: int | Lease = 0
    ) -> bool:
        """Put ``value`` only if ``key``'s mod revision is ``expected_mod_revision``
        (0: only if the key does not exist). True when this call won."""
        self._check_value(key, value)
        return self.txn(
            [Compare(key, "mod", "==", expected_mod_revision)],
            [Put(key, bytes(value), _lease_id(lease))],
        ).succeeded

    def grant_lease(self, ttl: float) -> Lease:
        """A new lease of ``ttl`` seconds, rounded to whole seconds (at least 1)."""
        seconds = max(1, round(ttl))
        return Lease(self, self._call(lambda: self._grant(seconds), repeatable=True), seconds)

    def keepalive(self, lease_id: int, retry: bool = True) -> int:
        """Refresh a lease; returns the TTL. Raises LeaseNotFoundError once it expired."""
        return self._call(lambda: self._keepalive(lease_id), retry=retry)

    def revoke(self, lease_id: int) -> None:
        self._call(lambda: self._revoke(lease_id))

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        """Watch keys under ``prefix`` from ``start_revision`` (default: after the current
        revision, i.e. changes from now on)."""
        if start_revision is None:
            start_revision = self.revision() + 1
        watch = Watch(self, prefix, start_revision)
        self._watches.add(watch)
        return watch

    def read_and_watch(self, prefix: str) -> tuple[list[KeyValue], Watch]:
        """The keys under ``prefix`` now, and a watch of every change after that read:
        together they miss nothing and repeat nothing (how a follower starts, or starts
        over after its watch ended for good)."""
        kvs, revision = self.get_prefix(prefix)
        return kvs, self.watch_prefix(prefix, start_revision=revision + 1)

    def wait_for(
        self, key: str, predicate: Callable[[KeyValue | None], bool], timeout: float
    ) -> KeyValue | None:
        """Block until ``predicate(current value of key)`` holds; returns that value.

        Raises RendezvousConnectionError (with what it waited for) when ``timeout`` passes."""
        kvs, watch = self.read_and_watch(key)
        with watch:
            current = next((kv for kv in kvs if kv.key == key), None)
            if predicate(current):
                return current
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RendezvousConnectionError(
                        f"timed out after {timeout:.1f}s waiting on {key!r}"
                    )
                ev = watch.get(timeout=remaining)
                if ev is None or ev.key != key:
                    continue
                current = ev.kv if ev.type == PUT else None
                if predicate(current):
                    return current

    def close(self) -> None:
        """End every watch of this client, then the client. Idempotent."""
        if not self._closed:
            self._closed = True
            for watch in list(self._watches):
                watch.cancel()
            self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _lease_id(lease: int | Lease) -> int:
    return lease.id if isinstance(lease, Lease) else int(lease or 0)
