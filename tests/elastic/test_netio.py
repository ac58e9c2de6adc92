"""The shared socket helpers (elastic/netio.py) on real socket pairs: reading exactly n
bytes, and the challenge/response handshake from both sides."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from elastic.netio import (
    CHALLENGE_SIZE,
    NONCE_BYTES,
    HandshakeLabels,
    HandshakeRefused,
    client_handshake,
    make_nonce,
    recv_exact,
    recv_exact_into,
    server_handshake,
)
from rendezvous.errors import RendezvousAuthError

LABELS = HandshakeLabels(server=b"test-server", client=b"test-client")
MAGIC = b"TESTMAG1"
OPENING_SIZE = len(MAGIC) + NONCE_BYTES


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def in_thread(fn, *args, **kwargs):
    """Run ``fn`` in a thread; ``result()`` returns its value or re-raises its error."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - re-raised by result()
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def result(timeout: float = 10.0):
        t.join(timeout)
        assert not t.is_alive(), "the thread hung"
        if "error" in out:
            raise out["error"]
        return out.get("value")

    return result


def check_magic(opening: bytes) -> bytes:
    if opening[: len(MAGIC)] != MAGIC:
        raise ValueError("not our channel")
    return opening[: len(MAGIC)]


def serve(sock: socket.socket, secret: str):
    """The server side of one handshake on ``sock``, in a thread."""
    deadline = time.monotonic() + 5
    return in_thread(
        server_handshake, sock, secret, LABELS, OPENING_SIZE, check_magic, deadline=deadline
    )


@pytest.mark.timeout(30)
def test_recv_exact_gathers_pieces_and_stops_at_deadline_or_eof(pair):
    a, b = pair
    for piece in (b"ab", b"cde", b"fghij"):
        b.sendall(piece)
    assert recv_exact(a, 10, time.monotonic() + 5) == b"abcdefghij"
    buf = bytearray(4)
    b.sendall(b"wxyz")
    recv_exact_into(a, memoryview(buf))
    assert bytes(buf) == b"wxyz"
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        recv_exact(a, 1, time.monotonic() + 0.2)
    assert time.monotonic() - t0 < 5
    a.settimeout(0.2)  # without a deadline, the socket's own timeout applies
    with pytest.raises(TimeoutError):
        recv_exact(a, 1)
    b.sendall(b"xy")
    b.shutdown(socket.SHUT_WR)
    with pytest.raises(ConnectionError, match="2 of 3 bytes"):
        recv_exact(a, 3, time.monotonic() + 5)


@pytest.mark.timeout(30)
def test_handshake_authenticates_both_sides_and_returns_the_parsed_opening(pair):
    a, b = pair
    server = serve(b, "s3cret")
    client_handshake(a, "s3cret", MAGIC + make_nonce(), LABELS, deadline=time.monotonic() + 5)
    assert server() == MAGIC
    a.sendall(b"after")  # the stream carries on after the handshake
    assert recv_exact(b, 5, time.monotonic() + 5) == b"after"


@pytest.mark.timeout(30)
def test_client_refuses_a_server_that_cannot_prove_the_secret(pair):
    a, b = pair
    server = serve(b, "other")
    with pytest.raises(RendezvousAuthError, match="the test server does not know"):
        client_handshake(
            a,
            "s3cret",
            MAGIC + make_nonce(),
            LABELS,
            deadline=time.monotonic() + 5,
            peer="the test server",
        )
    a.close()  # the client gives up without answering
    with pytest.raises(ConnectionError):
        server()


@pytest.mark.timeout(30)
def test_server_refuses_a_wrong_proof_and_labels_separate_channels(pair):
    a, b = pair
    server = serve(b, "s3cret")
    opening = MAGIC + make_nonce()
    a.sendall(opening)
    challenge = recv_exact(a, CHALLENGE_SIZE, time.monotonic() + 5)
    assert LABELS.check_server_proof("s3cret", opening, challenge[NONCE_BYTES:])
    # The right secret under another channel's labels is no proof here.
    other = HandshakeLabels(server=b"x-server", client=b"x-client")
    a.sendall(other.client_proof("s3cret", opening, challenge[:NONCE_BYTES]))
    with pytest.raises(HandshakeRefused):
        server()


@pytest.mark.timeout(30)
def test_server_answers_nothing_to_an_opening_it_refuses(pair):
    a, b = pair
    server = serve(b, "s3cret")
    a.sendall(b"GET / HTTP/1.0\r\n\r\n"[:OPENING_SIZE].ljust(OPENING_SIZE, b"x"))
    with pytest.raises(ValueError, match="not our channel"):
        server()
    b.close()
    a.settimeout(5)
    assert a.recv(1) == b""  # no challenge was sent
    with pytest.raises(ValueError):
        client_handshake(a, "s3cret", b"short", LABELS)
