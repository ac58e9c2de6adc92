"""What a hostile client can do to the project's gRPC servers (the embedded store here; the
ps shards share ``rendezvous.net.rpc``): refused is harmless. Calls that never send a body hold
no thread, an oversized or unauthenticated body is refused before it is buffered, a sniffed
request cannot be replayed, a malformed request gets one line back, and thousands of
watchers are served. Each test runs a real server process and measures it from outside."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import grpc
import grpc.aio
import pytest

from rendezvous import StoreSettings, open_store
from rendezvous.backends.embedded import SERVICE, EmbeddedServer, _encode
from rendezvous.errors import RendezvousAuthError, StaleIncarnationError
from rendezvous.net import auth
from rendezvous.net.rpc_client import RpcClient
from rendezvous.net.rpc_wire import MalformedRequest
from rendezvous.store import Put
from tests.support.hostile import never_sending_calls, proc_status
from tests.support.jobs import wait_until
from tests.support.paths import ROOT

QUICK = StoreSettings(request_timeout=3.0, retry_deadline=5.0, connect_timeout=5.0)


class StoreProcess:
    """``python -m rendezvous.server`` in a process of its own, so its threads and memory
    can be read from /proc while a test attacks it."""

    def __init__(self):
        self.secret = auth.make_secret()
        env = {**os.environ, "PYTHONPATH": str(ROOT), auth.ENV_SECRET: self.secret}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rendezvous.server"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None  # stdout=PIPE
        self._stdout = self.proc.stdout
        line = self._stdout.readline().split()
        assert line and line[0] == "ELASTIC_STORE_READY", line
        self.url = line[1]
        self.address = self.url.split("://", 1)[1]
        asker = RpcClient(self.address, SERVICE, self.secret)
        self.incarnation = asker.incarnation()  # what a proof is made for, asked of it
        asker.close()

    def status(self, field: str) -> int:
        return proc_status(self.proc.pid, field)

    @property
    def threads(self) -> int:
        return self.status("Threads")

    @property
    def rss_mib(self) -> float:
        return self.status("VmRSS") / 1024

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        self._stdout.close()


@pytest.fixture
def store_process():
    server = StoreProcess()
    try:
        yield server
    finally:
        server.close()


def _store(server: StoreProcess, secret: str | None = None):
    return open_store(server.url, secret or server.secret, QUICK)


@pytest.mark.parametrize("credentials", ["none", "wrong"])
def test_calls_that_never_send_a_body_hold_no_thread(store_process, credentials):
    """600 calls that send headers and no body (70 KB over 3 connections did it before):
    the store keeps serving everyone else, with no thread per held call."""
    metadata = (
        ()
        if credentials == "none"
        else auth.call_metadata(
            auth.make_secret(), f"/{SERVICE}/Range", b"", store_process.incarnation
        )
    )
    store = _store(store_process)
    before = store_process.threads
    channels, calls, release = never_sending_calls(store_process.address, 600, 3, metadata)
    try:
        # Refused at once from the headers, whatever the body would have been.
        answers = {(e.code(), e.details()) for e in (c.exception(timeout=30) for c in calls)}
        assert {code for code, _ in answers} == {grpc.StatusCode.UNAUTHENTICATED}, answers
        lease = store.grant_lease(5)
        store.put("/hostile/k", b"v", lease=lease)
        assert store.get("/hostile/k").value == b"v"
        assert store_process.threads <= before + 4
    finally:
        release()
        for c in channels:
            c.close()
        store.close()


def test_slow_authenticated_bodies_hold_no_thread(store_process):
    """A client with the secret that opens calls and sends nothing holds coroutines, not
    threads: the store goes on serving the others."""
    store = _store(store_process)
    before = store_process.threads
    metadata = auth.call_metadata(
        store_process.secret, f"/{SERVICE}/Range", b"", store_process.incarnation
    )
    # One proof per call (a nonce is used once): make them fresh.
    stop = threading.Event()

    def never():
        stop.wait(120)
        return
        yield

    channel = grpc.insecure_channel(store_process.address)
    calls = []
    try:
        for _ in range(300):
            metadata = auth.call_metadata(
                store_process.secret, f"/{SERVICE}/Range", b"", store_process.incarnation
            )
            calls.append(
                channel.stream_unary(f"/{SERVICE}/Range").future(
                    never(), metadata=metadata, timeout=60
                )
            )
        t0 = time.monotonic()
        for i in range(20):
            store.put(f"/slow/{i}", b"x")
        assert time.monotonic() - t0 < 5
        assert store_process.threads <= before + 4
        assert not any(c.done() for c in calls)  # still held, and harmless
    finally:
        stop.set()
        channel.close()
        store.close()


def test_oversized_and_unauthenticated_bodies_are_not_buffered(store_process):
    """Three 256 MiB requests with a wrong proof, and one with the right proof, leave the
    store's memory within 64 MiB of where it was."""
    rss = store_process.rss_mib
    big = b"\0" * (256 << 20)
    channel = grpc.insecure_channel(
        store_process.address, options=[("grpc.max_send_message_length", -1)]
    )
    try:
        method = channel.unary_unary(f"/{SERVICE}/Range")
        for secret, code in ((auth.make_secret(), grpc.StatusCode.UNAUTHENTICATED),) * 3 + (
            (store_process.secret, grpc.StatusCode.RESOURCE_EXHAUSTED),
        ):
            with pytest.raises(grpc.RpcError) as info:
                method(
                    big,
                    timeout=30,
                    metadata=auth.call_metadata(
                        secret, f"/{SERVICE}/Range", big, store_process.incarnation
                    ),
                )
            assert info.value.code() in (
                code,
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED,
            ), info.value
    finally:
        channel.close()
    assert store_process.rss_mib - rss < 64
    store = _store(store_process)
    assert store.revision() >= 1
    store.close()


def test_a_sniffed_request_cannot_be_replayed(store_process):
    client = RpcClient(store_process.address, SERVICE, store_process.secret)
    channel = grpc.insecure_channel(store_process.address)
    try:
        body = _encode(key="/k", prefix=False)
        incarnation = store_process.incarnation
        metadata = auth.call_metadata(store_process.secret, f"/{SERVICE}/Range", body, incarnation)
        method = channel.unary_unary(f"/{SERVICE}/Range")
        method(body, metadata=metadata, timeout=5)  # the original call
        for replay_body, what in ((body, "replayed"), (_encode(key="/", prefix=True), "replayed")):
            with pytest.raises(grpc.RpcError) as info:
                method(replay_body, metadata=metadata, timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert what in info.value.details()
        # A fresh nonce with the sniffed proof: the proof does not match.
        stamp, _nonce, _incarnation, mac = metadata[0][1].split(".")
        forged = ((auth.RPC_METADATA_KEY, f"{stamp}.{'0' * 24}.{incarnation}.{mac}"), metadata[1])
        with pytest.raises(grpc.RpcError) as info:
            method(body, metadata=forged, timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # The proof of one method does not open another.
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(f"/{SERVICE}/Txn")(
                body,
                metadata=auth.call_metadata(
                    store_process.secret, f"/{SERVICE}/Range", body, incarnation
                ),
                timeout=5,
            )
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # A proof made long ago (or with a clock far off) is refused.
        old = auth.call_metadata(
            store_process.secret,
            f"/{SERVICE}/Range",
            body,
            incarnation,
            now=time.time() - 10 * auth.PROOF_WINDOW,
        )
        with pytest.raises(grpc.RpcError) as info:
            method(body, metadata=old, timeout=5)
        assert "window" in info.value.details()
        # The honest client is unaffected.
        client.call("Range", _encode(key="/k", prefix=False))
    finally:
        channel.close()
        client.close()


def test_a_request_sniffed_before_a_restart_is_refused_after_it():
    """A store restarted in place with the same secret is another incarnation: a write
    sniffed before the restart and replayed within the window is refused, naming the
    incarnation; a store client (which asks the server its incarnation) goes on, and a
    client given the old incarnation is told that its record is stale."""
    secret = auth.make_secret()
    server = EmbeddedServer(secret)
    address = server.start()
    store = open_store(f"embedded://{address}", secret, QUICK)
    stale = RpcClient(address, SERVICE, secret, incarnation=server._rpc.incarnation)
    try:
        body = _encode(cmp=[], ok=[Put("/k", b"before").to_dict()], fail=[])
        sniffed = auth.call_metadata(secret, f"/{SERVICE}/Txn", body, server._rpc.incarnation)
        store.put("/k", b"before")
        stale.call("Range", _encode(key="/k", prefix=False))
        server.stop()
        server = EmbeddedServer(secret, bind=address)  # the same address, a new process
        server.start()
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(f"/{SERVICE}/Txn")(body, metadata=sniffed, timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "another incarnation" in info.value.details()
        assert server.kv.range("/k", False)[0] == []  # the new store holds nothing of it
        with pytest.raises(StaleIncarnationError, match="another incarnation"):
            stale.call("Range", _encode(key="/k", prefix=False))
        store.put("/k", b"after")
        after = store.get("/k")
        assert after is not None and after.value == b"after"
    finally:
        stale.close()
        store.close()
        server.stop()


def test_malformed_requests_get_one_line_and_the_store_goes_on(store_process):
    client = RpcClient(store_process.address, SERVICE, store_process.secret)
    try:
        for payload in (
            b"garbage",
            b"\xff\xff\xff\xff{}",
            _encode(cmp="x", ok=[], fail=[]),
            _encode(nothing=1),
        ):
            with pytest.raises(MalformedRequest) as info:
                client.call("Txn", payload)
            assert "\n" not in str(info.value)
        for ttl in (-5, 0, 10**12, "ten"):
            with pytest.raises(MalformedRequest, match="TTL"):
                client.call("Grant", _encode(ttl=ttl))
    finally:
        client.close()
    store = _store(store_process)
    store.put("/after", b"ok")
    assert store.get("/after").value == b"ok"
    store.close()
    with pytest.raises(RendezvousAuthError):
        _store(store_process, secret=auth.make_secret())


def test_thousands_of_watchers(store_process):
    """2000 watch streams (over 20 connections) all get the next write within seconds, and
    the store's thread count does not grow with them (it was one thread per watch)."""
    watchers, connections = 2000, 20
    before = store_process.threads
    received = 0

    async def watch_all():
        nonlocal received
        channels = [
            grpc.aio.insecure_channel(
                store_process.address, options=[("grpc.use_local_subchannel_pool", 1)]
            )
            for _ in range(connections)
        ]
        store = await asyncio.to_thread(_store, store_process)
        start = (await asyncio.to_thread(store.revision)) + 1
        body = _encode(prefix="/many/", start=start)
        calls = [
            channels[i % connections].unary_stream(f"/{SERVICE}/Watch")(
                body,
                metadata=auth.call_metadata(
                    store_process.secret, f"/{SERVICE}/Watch", body, store_process.incarnation
                ),
            )
            for i in range(watchers)
        ]

        async def first_event(call):
            nonlocal received
            async for message in call:
                from rendezvous.backends.embedded import _decode

                if _decode(message)["events"]:
                    received += 1
                    return

        tasks = [asyncio.ensure_future(first_event(c)) for c in calls]
        await asyncio.sleep(1.0)  # let every stream open (the write must come after)
        await asyncio.to_thread(store.put, "/many/k", b"v")
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        assert store_process.threads <= before + 4
        for c in calls:
            c.cancel()
        for ch in channels:
            await ch.close()
        await asyncio.to_thread(store.close)

    asyncio.run(watch_all())
    assert received == watchers
    wait_until(lambda: store_process.threads <= before + 4, 10, "the store's threads to settle")
