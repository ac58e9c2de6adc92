"""The embedded backend: a gRPC server over ``MemoryKV`` (run in the driver) and its client.

Every call carries proof of the job secret, made for this server process
(``rendezvous.net.rpc.RpcServer`` refuses others). Messages are JSON headers framed by
``rendezvous.net.rpc_wire.frame``; values travel base64-encoded, which is fine for a store
whose values are small records (the size limit applies).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from rendezvous.backends.memory import MemoryKV
from rendezvous.net.grpc_runtime import grpc
from rendezvous.net.rpc import RpcServer, ServerLimits
from rendezvous.net.rpc_client import RpcClient
from rendezvous.net.rpc_wire import MalformedRequest, frame, unframe
from rendezvous.store import (
    Compare,
    Delete,
    Event,
    KeyValue,
    KVStore,
    Put,
    StoreSettings,
    TxnResult,
    op_from_dict,
)

SERVICE = "elastic.rendezvous.KV"
#: how long a watch stream waits before sending an empty batch (a heartbeat: it moves the
#: watch's resume point past revisions of other prefixes). Every watch sends one per
#: period, so the period sets the idle cost of thousands of watchers (at 1 s, 1024 idle
#: workers cost the store and their processes about 1.5 CPU cores).
WATCH_POLL_SECONDS = 5.0
#: the longest lease a client may ask for (a day): longer ones are a client's bug
MAX_LEASE_TTL = 86_400
#: encoded watch batches kept for the other watchers of the same prefix and revisions
ENCODED_BATCHES_KEPT = 32


def _encode(**header) -> bytes:
    return frame(header)


def _decode(message: bytes) -> dict:
    return unframe(message)[0]


class EmbeddedServer:
    """The store server: ``start()`` returns its address; ``stop()`` ends it.

    Store calls are quick (a lock and a dict), so they run on the server's event loop;
    a watch is a coroutine waiting for a change under its prefix, so thousands of
    watchers cost no thread each. Leases expire on a thread of their own.

    A round of N workers is O(N) writes (registrations, failure reports) watched by O(N)
    watches, most of them of one key (the round): a write wakes only the watches whose
    prefix it falls under (found from the written keys, whatever the number of
    watches), and a batch is encoded once for every watch of its prefix that sends it,
    so the plan that N workers receive is encoded once, not N times.

    ``wakeups`` (watched prefix -> times a change woke its watches) and
    ``batches_encoded`` say how much of that work was done (tests and benchmarks)."""

    def __init__(
        self,
        secret: str,
        bind: str = "127.0.0.1:0",
        lease_check_interval: float = 0.1,
        history_limit: int = 100_000,
        limits: ServerLimits | None = None,
    ):
        self.kv = MemoryKV(history_limit=history_limit, on_commit=self._on_commit)
        # A fresh incarnation per server (RpcServer's default), not a fixed one: a store
        # restarted at its address with the same secret (a node or `rendezvous.server`
        # run again, ELASTIC_JOB_SECRET kept) starts empty, and a write replayed to it
        # from before its restart would put back a record of the store before. Its
        # clients have only the URL, no record to read an incarnation from: they ask
        # the server for it (``RpcClient``), which costs one round trip per client.
        self._rpc = RpcServer(SERVICE, secret, bind, limits)
        self._stop = threading.Event()
        self._lease_check_interval = lease_check_interval
        self._expirer: threading.Thread | None = None
        self._streams_generation = 0
        # watched prefix -> a future its watches wait on, set at the next change under it
        self._changed: dict[str, asyncio.Future] = {}
        # every revision up to this one has woken the watches it concerns
        self._woken_through = 0
        self._encoded: collections.OrderedDict[tuple, bytes] = collections.OrderedDict()
        self.wakeups: collections.Counter[str] = collections.Counter()
        #: the watch streams open now, by prefix (what the store serves, for tests and
        #: benchmarks: how many watches a job holds)
        self.watching: collections.Counter[str] = collections.Counter()
        self._watching_changed = threading.Condition()  # (``wait_unwatched``)
        self.batches_encoded = 0
        for name, fn in (
            ("Range", self._range),
            ("Txn", self._txn),
            ("Grant", self._grant),
            ("KeepAlive", self._keepalive),
            ("Revoke", self._revoke),
        ):
            self._rpc.add_unary(name, fn, blocking=False)
        self._rpc.add_stream("Watch", self._watch)

    @property
    def address(self) -> str | None:
        return self._rpc.address

    def start(self) -> str:
        address = self._rpc.start()
        self._expirer = threading.Thread(target=self._expire_loop, name="lease-expiry", daemon=True)
        self._expirer.start()
        return address

    def wait_unwatched(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no watch stream is open (its clients are
        gone); True if none is."""
        with self._watching_changed:
            return self._watching_changed.wait_for(lambda: not self.watching, timeout)

    def stop(self) -> None:
        self._stop.set()
        self._on_commit(None, None)  # waiting watches see the stop and end their streams
        self._rpc.stop(grace=0.2)
        if self._expirer is not None:
            self._expirer.join(timeout=5)

    def drop_watch_streams(self) -> None:
        """End every open watch stream (clients reconnect): a fault to test resumption."""
        self._streams_generation += 1
        self._on_commit(None, None)

    def _expire_loop(self) -> None:
        while not self._stop.wait(self._lease_check_interval):
            self.kv.expire_leases()

    def _on_commit(self, keys: Sequence[str] | None, revision: int | None) -> None:
        """Wake the watches of every prefix of ``keys``, written at ``revision`` (every
        watch: None); called under the store's lock, from any thread, so the wake-ups
        run on the loop in the order of the revisions."""
        loop = self._rpc.loop
        if loop is not None and not loop.is_closed():
            # A closing loop (RuntimeError) has no watch left to wake.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake_watches, keys, revision)

    def _wake_watches(self, keys: Sequence[str] | None, revision: int | None) -> None:
        if revision is not None:
            self._woken_through = max(self._woken_through, revision)
        if keys is None:
            woken = list(self._changed)
        else:
            # Each prefix of each key, looked up: the cost is the keys' length, not the
            # number of watches.
            woken = [
                p for p in {k[:i] for k in keys for i in range(len(k) + 1)} if p in self._changed
            ]
        for prefix in woken:
            changed = self._changed.pop(prefix)
            if not changed.done():
                changed.set_result(None)

    # ---- handlers ----
    def _range(self, request: bytes) -> bytes:
        req = _decode(request)
        kvs, rev = self.kv.range(str(req["key"]), bool(req["prefix"]))
        return _encode(kvs=[kv.to_dict() for kv in kvs], rev=rev)

    def _txn(self, request: bytes) -> bytes:
        req = _decode(request)
        result = self.kv.txn(
            [Compare.from_dict(c) for c in req["cmp"]],
            [op_from_dict(o) for o in req["ok"]],
            [op_from_dict(o) for o in req["fail"]],
        )
        return _encode(ok=result.succeeded, rev=result.revision)

    def _grant(self, request: bytes) -> bytes:
        ttl = _decode(request)["ttl"]
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= MAX_LEASE_TTL:
            raise MalformedRequest(
                f"lease TTL must be a whole number of seconds from 1 to "
                f"{MAX_LEASE_TTL}, got {ttl!r}"
            )
        return _encode(id=self.kv.grant(ttl))

    def _keepalive(self, request: bytes) -> bytes:
        return _encode(ttl=self.kv.keepalive(int(_decode(request)["id"])))

    def _revoke(self, request: bytes) -> bytes:
        self.kv.revoke(int(_decode(request)["id"]))
        return _encode()

    async def _watch(self, request: bytes, context) -> AsyncIterator[bytes]:
        req = _decode(request)
        prefix, next_rev = str(req["prefix"]), int(req["start"])
        generation = self._streams_generation
        self.watching[prefix] += 1
        try:
            while not self._stop.is_set() and generation == self._streams_generation:
                changed = self._changed.get(prefix)
                if changed is None:
                    changed = self._changed[prefix] = asyncio.get_running_loop().create_future()
                # (taken before reading: no wake-up is missed)
                events, next_rev = self.kv.events_since(prefix, next_rev, 0.0)
                if not events:
                    try:
                        await asyncio.wait_for(asyncio.shield(changed), WATCH_POLL_SECONDS)
                        self.wakeups[prefix] += 1
                        continue
                    except asyncio.TimeoutError:
                        if changed.done():
                            continue  # woken as the wait ended
                        # Idle: a batch (a heartbeat) whose ``next`` passes the revisions
                        # written elsewhere meanwhile (none of them woke this watch, taken
                        # before its read), so its resume point never falls behind the
                        # history kept.
                        next_rev = max(next_rev, self._woken_through + 1)
                # ``next``: every event below it has been sent (lets an idle watch's resume
                # point advance, so it never asks for history that could be compacted).
                yield self._batch(prefix, events, next_rev)
        finally:
            with self._watching_changed:
                self.watching[prefix] -= 1
                if self.watching[prefix] <= 0:
                    del self.watching[prefix]
                self._watching_changed.notify_all()

    def _batch(self, prefix: str, events: list[Event], next_rev: int) -> bytes:
        """A watch message, encoded once for every watch of ``prefix`` that sends these
        events (history does not change: the prefix, the first and last revisions and
        ``next`` name the batch)."""
        if not events:
            return _encode(events=[], next=next_rev)
        name = (prefix, events[0].revision, events[-1].revision, len(events), next_rev)
        batch = self._encoded.get(name)
        if batch is None:
            batch = _encode(events=[ev.to_dict() for ev in events], next=next_rev)
            self.batches_encoded += 1
            self._encoded[name] = batch
            if len(self._encoded) > ENCODED_BATCHES_KEPT:
                self._encoded.popitem(last=False)
        return batch


class EmbeddedStore(KVStore):
    """Client of an ``EmbeddedServer`` at ``address`` (``host:port``)."""

    scheme = "embedded"

    def __init__(self, address: str, secret: str, settings: StoreSettings = StoreSettings()):
        super().__init__(settings)
        self.address = address
        self._rpc = RpcClient(address, SERVICE, secret, timeout=settings.request_timeout)

    def _unary(self, name: str, **header) -> dict:
        return _decode(self._rpc.call(name, _encode(**header)))

    def _range(self, key: str, prefix: bool) -> tuple[list[KeyValue], int]:
        resp = self._unary("Range", key=key, prefix=prefix)
        return [KeyValue.from_dict(d) for d in resp["kvs"]], resp["rev"]

    def _txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete],
    ) -> TxnResult:
        resp = self._unary(
            "Txn",
            cmp=[c.to_dict() for c in compares],
            ok=[o.to_dict() for o in success],
            fail=[o.to_dict() for o in failure],
        )
        return TxnResult(resp["ok"], resp["rev"])

    def _grant(self, ttl: int) -> int:
        return self._unary("Grant", ttl=ttl)["id"]

    def _keepalive(self, lease_id: int) -> int:
        return self._unary("KeepAlive", id=lease_id)["ttl"]

    def _revoke(self, lease_id: int) -> None:
        self._unary("Revoke", id=lease_id)

    def _open_watch(
        self, prefix: str, start_revision: int
    ) -> tuple[Iterator[tuple[list[Event], int | None]], Callable[[], None]]:
        call = self._rpc.stream("Watch", _encode(prefix=prefix, start=start_revision))

        def batches() -> Iterator[tuple[list[Event], int | None]]:
            try:
                for message in call:
                    batch = _decode(message)
                    yield [Event.from_dict(d) for d in batch["events"]], batch["next"] - 1
            except grpc.RpcError as exc:
                raise self._rpc.translate(exc, f"watch at {self.address}") from None

        return batches(), call.cancel

    def _close(self) -> None:
        self._rpc.close()
