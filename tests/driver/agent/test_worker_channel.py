"""Per-host control (``driver.agent.workers`` and ``elastic.follow.agent``): a host's
workers register and learn their rounds through their agent's channel, a real Unix
socket, with real worker runtimes and a real embedded store. What the store holds is
read from its own counters: one lease and one watch for the host, whatever its number
of workers."""

from __future__ import annotations

import socket
import threading

import pytest

from driver.agent.workers import WorkerChannel, store_registrations
from driver.policy.planner import build_plan
from elastic.follow.agent import AgentFeed
from elastic.follow.base import FeedHooks, FeedSettings
from elastic.runtime import WorkerRuntime, WorkerSettings
from rendezvous import open_store
from rendezvous.host_channel import (
    MessageReader,
    Register,
    Registered,
    RoundNews,
    decode,
    encode,
    send,
)
from rendezvous.host_plan import RoundHead, read_view, view_of
from rendezvous.keys import JobKeys
from rendezvous.schema.workers import WorkerInfo
from rendezvous.store import PUT, KVStore
from tests.support.jobs import wait_until
from tests.support.rounds import publish_plan

HOST = "h1"


class HostAgent:
    """What ``driver.agent.loop.Agent`` does for the channel: one lease, one watch of
    the round's head, each newer round read for the host and published to its workers."""

    def __init__(self, store: KVStore, keys: JobKeys):
        self.store, self.keys = store, keys
        self.lease = store.grant_lease(10)
        self.lease.keep_alive(on_lost=lambda exc: None)
        self.channel = WorkerChannel(*store_registrations(store, keys, lambda: self.lease))
        self.path = self.channel.start()
        kvs, self._watch = store.read_and_watch(keys.plan_head)
        for kv in kvs:
            self._take(kv.value)
        threading.Thread(target=self._follow, daemon=True).start()

    def _take(self, head_value: bytes) -> None:
        view = read_view(self.store.get, self.keys, RoundHead.from_json(head_value), HOST)
        if view is not None:
            self.channel.publish(view)

    def _follow(self) -> None:
        for event in self._watch:  # ends when the watch is cancelled
            if event.type == PUT and event.key == self.keys.plan_head:
                self._take(event.value)

    def close(self) -> None:
        self._watch.cancel()
        self.channel.close()
        self.lease.stop_keep_alive()


def worker(url: str, secret: str, worker_id: str, path: str) -> WorkerRuntime:
    settings = WorkerSettings(
        store_url=url,
        job_id="j",
        worker_id=worker_id,
        host=HOST,
        slot=int(worker_id[1:]),
        secret=secret,
        round_timeout=20.0,
        agent_socket=path,
    )
    return WorkerRuntime(settings)


def test_the_channels_messages_read_back_as_written():
    info = WorkerInfo("w0", HOST, 0, 42, "127.0.0.1:1")
    plan = build_plan(3, [info])
    for message in (Register(info), Registered(7), RoundNews.of(view_of(plan, HOST))):
        assert decode(encode(message)) == message
    assert RoundNews.of(view_of(plan, HOST)).view().member("w0") is not None
    with pytest.raises(ValueError):
        decode(b'{"op": "shout"}')


@pytest.mark.timeout(60)
def test_a_hosts_workers_hold_one_lease_and_one_watch_and_get_their_rounds(embedded_server):
    url, secret = f"embedded://{embedded_server.address}", embedded_server.secret
    keys = JobKeys("j")
    store = open_store(url, secret)
    agent = HostAgent(store, keys)
    runtimes = [worker(url, secret, f"w{i}", agent.path) for i in range(3)]
    try:
        for rt in runtimes:
            rt.start()
        kvs, _ = store.get_prefix(keys.workers)
        assert sorted(kv.key for kv in kvs) == [keys.worker(f"w{i}") for i in range(3)]
        assert {kv.lease for kv in kvs} == {agent.lease.id}
        assert {rt.lease_id for rt in runtimes} == {agent.lease.id}  # reports go under it
        # The store's own counters: the agent's lease and its watch, none per worker.
        assert embedded_server.kv.lease_count == 1
        assert dict(embedded_server.watching) == {keys.plan_head: 1}

        # A round of the three, and the next one: each worker holds its part of each.
        infos = [WorkerInfo.from_json(kv.value) for kv in kvs]
        publish_plan(store, keys, build_plan(1, infos))
        joined: dict[str, object] = {}

        def join(rt: WorkerRuntime) -> None:
            joined[rt.settings.worker_id] = rt.join(after_round=0)

        threads = [threading.Thread(target=join, args=(rt,), daemon=True) for rt in runtimes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(rt.member.rank for rt in runtimes if rt.member is not None) == [0, 1, 2]
        publish_plan(store, keys, build_plan(2, infos[:2]), build_plan(1, infos))
        wait_until(lambda: all(rt.pending_round() == 2 for rt in runtimes), 10, "round 2 to arrive")
    finally:
        for rt in runtimes:
            rt.shutdown()
        agent.close()
        store.close()


@pytest.mark.timeout(30)
def test_a_worker_whose_process_ends_is_unregistered_at_once(embedded_server):
    url, secret = f"embedded://{embedded_server.address}", embedded_server.secret
    keys = JobKeys("j")
    store = open_store(url, secret)
    agent = HostAgent(store, keys)
    try:
        for worker_id in ("w0", "w1"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(agent.path)
            send(sock, Register(WorkerInfo(worker_id, HOST, 0, 1, "127.0.0.1:1")))
            reader = MessageReader(sock)
            assert reader.next() == Registered(agent.lease.id)
            assert store.get(keys.worker(worker_id)) is not None
            if worker_id == "w0":
                sock.close()  # as its process ends: the kernel closes its end
            else:
                agent.channel.forget(worker_id)  # the agent saw its child exit first
            wait_until(
                lambda w=worker_id: store.get(keys.worker(w)) is None,
                5,
                f"{worker_id}'s registration to go",
            )
            sock.close()
        assert agent.channel.registered == frozenset()
    finally:
        agent.close()
        store.close()


@pytest.mark.timeout(30)
def test_a_worker_whose_agent_goes_ends_itself(embedded_server):
    store = open_store(f"embedded://{embedded_server.address}", embedded_server.secret)
    keys = JobKeys("j")
    agent = HostAgent(store, keys)
    gone, closed = threading.Event(), threading.Event()
    hooks = FeedHooks(lambda view: None, lambda: 0, closed, gone.set)
    feed = AgentFeed(FeedSettings("w0", agent_socket=agent.path), hooks)
    try:
        feed.start(WorkerInfo("w0", HOST, 0, 1, "127.0.0.1:1"))
        assert feed.lease_id == agent.lease.id
        agent.channel.close()  # the agent died: its end of every channel closes
        assert gone.wait(10)
    finally:
        closed.set()
        agent.close()
        store.close()


@pytest.mark.timeout(30)
def test_a_worker_that_reads_nothing_holds_up_no_other_workers_rounds(embedded_server):
    """A frozen worker (SIGSTOP: it reads nothing) fills its socket's buffer; the
    agent's rounds still reach the others at once, and ``publish`` never waits."""
    store = open_store(f"embedded://{embedded_server.address}", embedded_server.secret)
    agent = HostAgent(store, JobKeys("j"))
    clients = []
    try:
        for worker_id in ("frozen", "live"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(agent.path)
            send(sock, Register(WorkerInfo(worker_id, HOST, 0, 1, "127.0.0.1:1")))
            clients.append(sock)
        live = MessageReader(clients[1])
        # Rounds of 200 members on this host (about 30 KB each): megabytes in all, more
        # than the frozen worker's socket holds.
        infos = [WorkerInfo(f"m{i}", HOST, i, 1, f"127.0.0.1:{1000 + i}") for i in range(200)]
        for round_id in range(1, 121):
            agent.channel.publish(view_of(build_plan(round_id, infos), HOST))
        newest = 0
        while newest < 120:
            message = live.next()
            if isinstance(message, RoundNews):
                newest = message.view().round_id
    finally:
        for sock in clients:
            sock.close()
        agent.close()
        store.close()
