"""The listener and the handshake, on real sockets (members are threads of this process):
the job secret, stale rounds, early connections, deadlines and round changes."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from elastic.comm import (
    CommSettings,
    CommunicatorClosedError,
    Membership,
    PeerLostError,
    RingCommunicator,
    RingListener,
    wire,
)
from elastic.comm.peers.listener import dial
from elastic.netio import CHALLENGE_SIZE, PROOF_SIZE, recv_exact
from rendezvous.errors import RendezvousAuthError
from rendezvous.net.auth import make_nonce, make_secret
from rendezvous.net.url import Endpoint

FAST = CommSettings(connect_timeout=10.0, transport="tcp")


@pytest.fixture
def secret():
    return make_secret()


@pytest.fixture
def listeners(secret):
    made = []

    def make(n):
        new = [RingListener("127.0.0.1", secret=secret) for _ in range(n)]
        made.extend(new)
        return new

    try:
        yield make
    finally:
        for lst in made:
            lst.close()


class Built:
    """Communicators built concurrently in threads; ``result(r)`` re-raises errors."""

    def __init__(self, listeners, round_id, secret, settings=FAST, ranks=None):
        self.comms = {}
        self.errors = {}
        addresses = tuple(lst.address for lst in listeners)
        self.threads = []
        for r in range(len(listeners)) if ranks is None else ranks:
            t = threading.Thread(
                target=self._build,
                daemon=True,
                args=(Membership(round_id, r, addresses, secret), listeners[r], settings),
            )
            t.start()
            self.threads.append(t)

    def _build(self, m, lst, settings):
        try:
            self.comms[m.rank] = RingCommunicator(m, lst, settings)
        except Exception as e:  # noqa: BLE001 - re-raised by result()
            self.errors[m.rank] = e

    def join(self, timeout=20.0):
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "construction hung"
        return self

    def close(self):
        for c in self.comms.values():
            c.close("test done")


def allreduce_all(comms, value_of=lambda r: float(r + 1)):
    out = {}

    def run(r, c):
        out[r] = c.allreduce(np.full(3, value_of(r)))

    ts = [threading.Thread(target=run, args=(r, c), daemon=True) for r, c in comms.items()]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    return out


def raw_hello(address, round_id=1, src=1, dst=0, world=2, channel=wire.CHANNEL_DATA):
    sock = socket.create_connection(Endpoint.parse(address).sockaddr, timeout=5)
    hello = wire.encode_hello(wire.Hello(channel, round_id, src, dst, world, make_nonce()))
    sock.sendall(hello)
    return sock, hello


def assert_dropped(sock):
    """The server closes the connection without a verdict."""
    sock.settimeout(5)
    try:
        assert sock.recv(1) == b""
    except ConnectionResetError:
        pass
    finally:
        sock.close()


@pytest.mark.timeout(30)
def test_connection_that_does_not_prove_the_secret_is_dropped(listeners, secret):
    (lst,) = listeners(1)
    # 1. A client with a wrong proof of the secret.
    sock, hello = raw_hello(lst.address)
    challenge = recv_exact(sock, CHALLENGE_SIZE, time.monotonic() + 5)
    sock.sendall(wire.HANDSHAKE.client_proof("not-the-secret", hello, challenge[:16]))
    assert_dropped(sock)
    # 2. A client that sends garbage instead of a hello.
    sock = socket.create_connection(Endpoint.parse(lst.address).sockaddr, timeout=5)
    sock.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 100)
    assert_dropped(sock)
    assert lst.wait_for(lambda x: x.refused_count >= 2, timeout=5)
    assert lst.pending() == []
    # 3. The server cannot prove the secret to a client that has another one.
    with pytest.raises(RendezvousAuthError):
        dial(
            lst.address,
            "another-secret",
            wire.CHANNEL_DATA,
            1,
            1,
            0,
            2,
            time.monotonic() + 5,
            lambda: None,
        )
    assert lst.pending() == []


@pytest.mark.timeout(30)
def test_listener_still_serves_members_after_refusing_intruders(listeners, secret):
    lsts = listeners(2)
    for _ in range(3):
        sock, _hello = raw_hello(lsts[0].address)
        recv_exact(sock, CHALLENGE_SIZE, time.monotonic() + 5)
        sock.sendall(b"\x00" * PROOF_SIZE)
        assert_dropped(sock)
    built = Built(lsts, 1, secret).join()
    assert not built.errors, built.errors
    assert allreduce_all(built.comms)[0].tolist() == [3.0] * 3
    built.close()


@pytest.mark.timeout(30)
def test_strangers_holding_every_handshake_slot_do_not_keep_peers_out(listeners, secret):
    """Connections that open and never speak (a local user without the secret) take
    every slot while a round forms: the oldest is pushed out for each newcomer, so the
    members still connect and the round forms long before any deadline."""
    lsts = listeners(2)
    silent = [
        socket.create_connection(Endpoint.parse(lsts[1].address).sockaddr, timeout=5)
        for _ in range(2 * 64)
    ]
    try:
        built = Built(lsts, 1, secret).join()
        assert not built.errors, built.errors
        assert allreduce_all(built.comms)[0].tolist() == [3.0] * 3
        assert lsts[1].evicted_count >= 64
        built.close()
    finally:
        for s in silent:
            s.close()


@pytest.mark.timeout(30)
def test_connection_from_an_older_round_is_refused(listeners, secret):
    (lst,) = listeners(1)
    lst.advance(5)
    with pytest.raises(CommunicatorClosedError, match="round newer than 4"):
        dial(lst.address, secret, wire.CHANNEL_DATA, 4, 1, 0, 2, time.monotonic() + 5, lambda: None)
    assert lst.stale_count == 1
    sock = dial(
        lst.address, secret, wire.CHANNEL_DATA, 6, 1, 0, 2, time.monotonic() + 5, lambda: None
    )
    try:
        assert lst.wait_for(lambda x: (6, 1, wire.CHANNEL_DATA) in x.pending(), timeout=5)
        # Beginning round 7 drops what was parked for round 6.
        lst.advance(7)
        assert lst.pending() == []
    finally:
        sock.close()


@pytest.mark.timeout(30)
def test_early_connections_are_parked_until_the_round_is_built(listeners, secret):
    lsts = listeners(2)
    late = Built(lsts, 3, secret, ranks=[1])
    # Rank 1 has dialled rank 0, whose communicator does not exist yet.
    assert lsts[0].wait_for(
        lambda x: {(3, 1, wire.CHANNEL_DATA), (3, 1, wire.CHANNEL_CTRL)} <= set(x.pending()),
        timeout=10,
    )
    early = Built(lsts, 3, secret, ranks=[0]).join()
    late.join()
    assert not early.errors and not late.errors, (early.errors, late.errors)
    comms = {**early.comms, **late.comms}
    assert allreduce_all(comms)[1].tolist() == [3.0] * 3
    for c in comms.values():
        c.close()


@pytest.mark.timeout(30)
def test_peer_that_never_builds_its_communicator_is_lost_at_the_deadline(listeners, secret):
    lsts = listeners(2)
    settings = CommSettings(connect_timeout=0.5, transport="tcp")
    t0 = time.monotonic()
    with pytest.raises(PeerLostError, match="rank 1 did not connect") as info:
        RingCommunicator(
            Membership(1, 0, tuple(x.address for x in lsts), secret), lsts[0], settings
        )
    assert info.value.rank == 1
    assert 0.4 < time.monotonic() - t0 < 3.0


@pytest.mark.timeout(30)
def test_peer_address_with_nobody_listening_is_lost_at_the_deadline(listeners, secret):
    (lst,) = listeners(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # bound, never listening
        settings = CommSettings(connect_timeout=0.5, transport="tcp")
        with pytest.raises(PeerLostError, match="rank 1 did not answer"):
            RingCommunicator(Membership(1, 0, (lst.address, dead), secret), lst, settings)


@pytest.mark.timeout(30)
def test_newer_round_aborts_a_communicator_still_being_built(listeners, secret):
    lsts = listeners(2)
    building = Built(
        lsts, 1, secret, settings=CommSettings(connect_timeout=30, transport="tcp"), ranks=[0]
    )
    # Rank 0 has dialled rank 1 and now waits for rank 1 to dial back.
    assert lsts[1].wait_for(lambda x: (1, 0, wire.CHANNEL_CTRL) in x.pending(), timeout=10)
    t0 = time.monotonic()
    lsts[0].advance(2)
    building.join(timeout=5)
    assert time.monotonic() - t0 < 1.0
    assert isinstance(building.errors[0], CommunicatorClosedError)
    assert "superseded by round 2" in str(building.errors[0])


@pytest.mark.timeout(30)
def test_newer_round_aborts_a_dial_to_a_peer_that_went_silent_mid_handshake(listeners, secret):
    """A neighbour's host cut off the network just after its kernel took the connection:
    the dial waits for a handshake answer that never comes. A newer round must end that
    wait at once, not at the connect deadline (the Slurm cut test's 30 s stall)."""
    (lst,) = listeners(1)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # the kernel completes connections; nobody ever answers
        right = f"127.0.0.1:{silent.getsockname()[1]}"
        settings = CommSettings(connect_timeout=30, transport="tcp")
        result: dict[str, BaseException] = {}

        def build():
            try:
                RingCommunicator(Membership(1, 0, (lst.address, right), secret), lst, settings)
            except Exception as e:  # noqa: BLE001 - checked below
                result["error"] = e

        building = threading.Thread(target=build, daemon=True)
        building.start()
        building.join(0.3)  # (the dial is connected and waits for the answer by now)
        t0 = time.monotonic()
        lst.advance(2)
        building.join(5)
        assert not building.is_alive(), "the dial waited for its connect deadline"
        assert time.monotonic() - t0 < 1.0
        assert isinstance(result["error"], CommunicatorClosedError)
        assert "superseded by round 2" in str(result["error"])


@pytest.mark.timeout(30)
def test_building_a_newer_round_closes_the_older_communicator(listeners, secret):
    lsts = listeners(2)
    old = Built(lsts, 1, secret).join()
    assert not old.errors
    new = Built(lsts, 2, secret).join()
    assert not new.errors
    for c in old.comms.values():
        with pytest.raises(CommunicatorClosedError, match="superseded by round 2"):
            c.allreduce(np.ones(2))
    assert allreduce_all(new.comms)[0].tolist() == [3.0] * 3
    new.close()


@pytest.mark.timeout(30)
def test_settings_and_membership_are_checked(listeners, secret):
    (lst,) = listeners(1)
    with pytest.raises(ValueError, match="secret differs"):
        RingCommunicator(Membership(1, 0, (lst.address,), "other"), lst)
    with pytest.raises(ValueError):
        RingListener("127.0.0.1", secret="")
    m = Membership(1, 0, [lst.address], secret)
    assert m.addresses == (lst.address,) and secret not in repr(m)
    comm = RingCommunicator(m, lst)
    assert comm.transport == "local" and comm.size == 1
    assert comm.allreduce(np.arange(3), op="average").tolist() == [0, 1, 2]
    comm.close()
    with pytest.raises(CommunicatorClosedError):
        comm.barrier()


def _fds():
    import os

    return len(os.listdir("/proc/self/fd"))


def _memfd_maps():
    with open("/proc/self/maps") as f:
        return sum("elastic-ring" in line for line in f)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_rounds_do_not_leak_sockets_threads_or_mappings(listeners, secret, transport):
    lsts = listeners(3)
    settings = CommSettings(connect_timeout=10.0, transport=transport)

    def one_round(round_id):
        built = Built(lsts, round_id, secret, settings).join()
        assert not built.errors, built.errors
        assert allreduce_all(built.comms)[0].tolist() == [6.0] * 3
        return built

    one_round(1)  # the next round closes it (listener.advance)
    base_fds, base_maps = _fds(), _memfd_maps()
    for round_id in range(2, 22):
        last = one_round(round_id)
    last.close()
    # Everything of the closed rounds is gone, including what round 1 held when the
    # baseline was taken (3 monitors; 4 sockets and a wake pipe each).
    # (close() joins the monitor thread, so none may be left.)
    assert not [t for t in threading.enumerate() if t.name.startswith("ring-monitor")]
    assert _fds() <= base_fds - 3 * 6
    assert _memfd_maps() < base_maps or transport == "tcp"
    assert _memfd_maps() == 0
