"""The embedded backend: a gRPC server over ``MemoryKV`` (run in the driver) and its client.

Every call carries proof of the job secret (``rpc.RpcServer`` refuses others).
Messages are JSON headers framed by ``rpc.frame``; values travel base64-encoded,
which is fine for a store whose values are small records (the size limit applies).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import grpc

from rendezvous.memory import MemoryKV
from rendezvous.rpc import (
    MalformedRequest,
    RpcClient,
    RpcServer,
    ServerLimits,
    frame,
    translate_rpc_error,
    unframe,
)
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
#: how long a watch stream waits before sending an empty batch (a heartbeat)
WATCH_POLL_SECONDS = 1.0
#: the longest lease a client may ask for (a day): longer ones are a client's bug
MAX_LEASE_TTL = 86_400


def _encode(**header) -> bytes:
    return frame(header)


def _decode(message: bytes) -> dict:
    return unframe(message)[0]


class EmbeddedServer:
    """The store server: ``start()`` returns its address; ``stop()`` ends it.

    Store calls are quick (a lock and a dict), so they run on the server's event loop;
    a watch is a coroutine waiting for the next revision, so thousands of watchers cost
    no thread each. Leases expire on a thread of their own."""

    def __init__(
        self,
        secret: str,
        bind: str = "127.0.0.1:0",
        lease_check_interval: float = 0.1,
        history_limit: int = 100_000,
        limits: ServerLimits | None = None,
    ):
        self.kv = MemoryKV(history_limit=history_limit, on_commit=self._on_commit)
        self._rpc = RpcServer(SERVICE, secret, bind, limits)
        self._stop = threading.Event()
        self._lease_check_interval = lease_check_interval
        self._expirer: threading.Thread | None = None
        self._streams_generation = 0
        self._revision_changed: asyncio.Future | None = None  # set at each new revision
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

    def stop(self) -> None:
        self._stop.set()
        self._on_commit()  # waiting watches see the stop and end their streams
        self._rpc.stop(grace=0.2)
        if self._expirer is not None:
            self._expirer.join(timeout=5)

    def drop_watch_streams(self) -> None:
        """End every open watch stream (clients reconnect): a fault to test resumption."""
        self._streams_generation += 1
        self._on_commit()

    def _expire_loop(self) -> None:
        while not self._stop.wait(self._lease_check_interval):
            self.kv.expire_leases()

    def _on_commit(self) -> None:
        """Wake every waiting watch (called under the store's lock, from any thread)."""
        loop = self._rpc.loop
        if loop is not None and not loop.is_closed():
            # A closing loop (RuntimeError) has no watch left to wake.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake_watches)

    def _wake_watches(self) -> None:
        changed, self._revision_changed = self._revision_changed, None
        if changed is not None and not changed.done():
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
        while not self._stop.is_set() and generation == self._streams_generation:
            if self._revision_changed is None:
                self._revision_changed = asyncio.get_running_loop().create_future()
            changed = self._revision_changed  # taken before reading: no wake-up is missed
            events, next_rev = self.kv.events_since(prefix, next_rev, 0.0)
            if not events:
                try:
                    await asyncio.wait_for(asyncio.shield(changed), WATCH_POLL_SECONDS)
                    continue
                except asyncio.TimeoutError:
                    pass  # idle: send an empty batch (a heartbeat that advances ``next``)
            # ``next``: every event below it has been sent (lets an idle watch's resume
            # point advance, so it never asks for history that could be compacted).
            yield _encode(events=[ev.to_dict() for ev in events], next=next_rev)


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
                raise translate_rpc_error(exc, f"watch at {self.address}") from None

        return batches(), call.cancel

    def _close(self) -> None:
        self._rpc.close()
