"""The embedded store's state: an in-memory, thread-safe etcd v3 model.

Revisions start at 1 and grow by one per write (a transaction writes at one revision);
a write that changes nothing (a delete of nothing) does not move the revision.
History is kept for watches up to ``history_limit`` events; a watch from before that
raises ``WatchCompactedError``. Time is passed in (``now``) so expiry is testable.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rendezvous.errors import LeaseNotFoundError, WatchCompactedError
from rendezvous.store import DELETE, PUT, Compare, Delete, Event, KeyValue, Put, TxnResult


@dataclass
class _LeaseRecord:
    ttl: int
    expires_at: float
    keys: set = field(default_factory=set)


def _compare_holds(c: Compare, kv: KeyValue | None) -> bool:
    actual: Any  # bytes for a value compare, int otherwise (and so is expected)
    expected: Any
    if c.target == "value":
        if kv is None:
            return c.op == "!="
        actual, expected = kv.value, c.value
    else:
        actual = (
            0
            if kv is None
            else {"mod": kv.mod_revision, "create": kv.create_revision, "version": kv.version}[
                c.target
            ]
        )
        expected = c.value
    return {
        "==": actual == expected,
        "!=": actual != expected,
        "<": actual < expected,
        ">": actual > expected,
    }[c.op]


def prefix_end(prefix: str) -> str:
    """The first key after every key that starts with ``prefix`` (etcd's range_end)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\U0010ffff"


class MemoryKV:
    def __init__(
        self,
        history_limit: int = 100_000,
        clock=time.monotonic,
        on_commit: Callable[[Sequence[str], int], None] | None = None,
    ):
        self._clock = clock
        # told the keys and the number of every revision (it must not block)
        self._on_commit = on_commit
        self._cond = threading.Condition()
        self._data: dict[str, KeyValue] = {}
        self._sorted_keys: list[str] = []
        self._history: list[Event] = []
        self._history_revisions: list[int] = []  # parallel to _history, for bisect
        self._history_limit = history_limit
        self.compacted_revision = 0  # events at or below this revision are forgotten
        self.revision = 1
        self._leases: dict[int, _LeaseRecord] = {}
        self._next_lease = 0x1000

    @property
    def lease_count(self) -> int:
        """The leases alive now (for tests and benchmarks: how many a job holds)."""
        with self._cond:
            return len(self._leases)

    # ---- reads ----
    def range(self, key: str, prefix: bool) -> tuple[list[KeyValue], int]:
        with self._cond:
            if not prefix:
                kv = self._data.get(key)
                return ([kv] if kv else []), self.revision
            lo = bisect.bisect_left(self._sorted_keys, key)
            hi = (
                bisect.bisect_left(self._sorted_keys, prefix_end(key))
                if key
                else len(self._sorted_keys)
            )
            return [self._data[k] for k in self._sorted_keys[lo:hi]], self.revision

    # ---- writes ----
    def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete],
    ) -> TxnResult:
        """Raises LeaseNotFoundError when a put names a lease that does not exist."""
        with self._cond:
            ok = all(_compare_holds(c, self._data.get(c.key)) for c in compares)
            ops = success if ok else failure
            for op in ops:
                if isinstance(op, Put) and op.lease and op.lease not in self._leases:
                    raise LeaseNotFoundError(f"lease {op.lease:x} not found")
            events: list[Event] = []
            new_rev = self.revision + 1
            for op in ops:
                if isinstance(op, Put):
                    events.append(self._put(op, new_rev))
                else:
                    keys = (
                        ([op.key] if op.key in self._data else [])
                        if not op.prefix
                        else [kv.key for kv in self.range(op.key, True)[0]]
                    )
                    events.extend(self._delete(k, new_rev) for k in keys)
            if events:
                self._commit(events, new_rev)
            return TxnResult(ok, self.revision)

    def _put(self, op: Put, rev: int) -> Event:
        old = self._data.get(op.key)
        if old is None:
            bisect.insort(self._sorted_keys, op.key)
        elif old.lease and old.lease != op.lease and old.lease in self._leases:
            self._leases[old.lease].keys.discard(op.key)
        kv = KeyValue(
            op.key,
            op.value,
            old.create_revision if old else rev,
            rev,
            (old.version if old else 0) + 1,
            op.lease,
        )
        self._data[op.key] = kv
        if op.lease:
            self._leases[op.lease].keys.add(op.key)
        return Event(PUT, kv)

    def _delete(self, key: str, rev: int) -> Event:
        old = self._data.pop(key)
        self._sorted_keys.pop(bisect.bisect_left(self._sorted_keys, key))
        if old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        return Event(DELETE, KeyValue(key, b"", 0, rev, 0, 0))

    def _commit(self, events: list[Event], rev: int) -> None:
        self.revision = rev
        self._history.extend(events)
        self._history_revisions.extend(ev.revision for ev in events)
        # Trim in chunks so appends stay amortised O(1).
        excess = len(self._history) - self._history_limit
        if excess > self._history_limit // 4:
            self.compacted_revision = self._history_revisions[excess - 1]
            del self._history[:excess], self._history_revisions[:excess]
        self._cond.notify_all()
        if self._on_commit is not None:
            self._on_commit([ev.key for ev in events], rev)

    # ---- leases ----
    def grant(self, ttl: int) -> int:
        with self._cond:
            self._next_lease += 1
            self._leases[self._next_lease] = _LeaseRecord(ttl, self._clock() + ttl)
            return self._next_lease

    def keepalive(self, lease_id: int) -> int:
        """Raises LeaseNotFoundError for an unknown or expired lease."""
        with self._cond:
            rec = self._leases.get(lease_id)
            if rec is None or rec.expires_at <= self._clock():
                raise LeaseNotFoundError(f"lease {lease_id:x} not found (expired or revoked)")
            rec.expires_at = self._clock() + rec.ttl
            return rec.ttl

    def revoke(self, lease_id: int) -> None:
        """Raises LeaseNotFoundError for an unknown lease."""
        with self._cond:
            if lease_id not in self._leases:
                raise LeaseNotFoundError(f"lease {lease_id:x} not found")
            self._end_lease(lease_id)

    def expire_leases(self) -> int:
        """End every lease past its deadline (deleting its keys); returns how many ended."""
        with self._cond:
            now = self._clock()
            expired = [lid for lid, rec in self._leases.items() if rec.expires_at <= now]
            for lid in expired:
                self._end_lease(lid)
            return len(expired)

    def _end_lease(self, lease_id: int) -> None:
        rec = self._leases.pop(lease_id)
        if rec.keys:
            rev = self.revision + 1
            self._commit([self._delete(k, rev) for k in sorted(rec.keys)], rev)

    # ---- watches ----
    def events_since(
        self, prefix: str, start_revision: int, timeout: float
    ) -> tuple[list[Event], int]:
        """Events under ``prefix`` at revisions >= ``start_revision``, waiting up to ``timeout``
        for the first, and the revision to ask from next time. Raises WatchCompactedError
        if that history is gone."""
        deadline = self._clock() + timeout
        with self._cond:
            while True:
                if start_revision <= self.compacted_revision:
                    raise WatchCompactedError(
                        f"revision {start_revision} was compacted "
                        f"(history kept from {self.compacted_revision + 1})"
                    )
                lo = bisect.bisect_left(self._history_revisions, start_revision)
                found = [ev for ev in self._history[lo:] if ev.key.startswith(prefix)]
                start_revision = max(start_revision, self.revision + 1)
                if found:
                    return found, start_revision
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return [], start_revision
                self._cond.wait(remaining)
