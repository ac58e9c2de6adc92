"""Socket helpers shared by the worker's TCP channels (the ring listener and dialer, and
the parameter-server bulk channel): read exactly n bytes, prove the job secret both ways,
wake a ``poll()`` from another thread, and tell a dead connection from ``poll()`` events.

The handshake (one per connection, before anything else is read):

    client -> server  OPENING  the channel's own bytes (magic, version, who and what),
                               ending with a fresh client nonce          (fixed size)
    server -> client  nonce_s + HMAC(secret, label_server + OPENING + nonce_c)
    client -> server           HMAC(secret, label_client + OPENING + nonce_s)

Each side proves the job secret by answering the other's nonce, and nothing sends the
secret itself (``rendezvous.net.auth.challenge_response``). Both proofs bind the whole
opening, so a recorded handshake cannot be replayed for another round, rank or request;
the two labels (one pair per channel kind) stop either side being used as an oracle for
the other direction, or one channel's answers for another channel. What follows the
handshake (a verdict byte, requests) is the channel's business. The ring builds its
opening in ``comm.wire``; the ps bulk channel's is ``ps.bulk``'s ``MAGIC`` and a
nonce.

Example, both halves, for a channel of one's own:

    LABELS = HandshakeLabels(server=b"my-server\x00", client=b"my-client\x00")
    MAGIC = b"MYCHAN01"

    # client
    sock = socket.create_connection(address, timeout=5.0)
    client_handshake(sock, secret, MAGIC + make_nonce(), LABELS,
                     deadline=time.monotonic() + 5.0, peer=f"ps bulk port {address}")

    # server, in the thread that serves the accepted connection
    def check_magic(opening: bytes) -> bytes:
        if opening[:len(MAGIC)] != MAGIC:
            raise ValueError("not a bulk connection")
        return opening

    try:
        server_handshake(conn, secret, LABELS, len(MAGIC) + NONCE_BYTES, check_magic,
                         deadline=time.monotonic() + 10.0)
    except (HandshakeRefused, ValueError, OSError):   # TimeoutError and ConnectionError too
        conn.close()

With ``deadline=None`` every read waits as long as the socket's own timeout allows
(``sock.settimeout``), which suits a channel that sets one timeout per request.
"""

from __future__ import annotations

import os
import select
import socket
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from rendezvous.errors import RendezvousAuthError
from rendezvous.net.auth import (
    NONCE_BYTES,
    RESPONSE_BYTES,
    challenge_response,
    check_challenge_response,
    make_nonce,
)

T = TypeVar("T")

CHALLENGE_SIZE = NONCE_BYTES + RESPONSE_BYTES  # what the server sends: nonce_s + proof
PROOF_SIZE = RESPONSE_BYTES  # what the client answers


# What poll() reports on a dead connection however it was asked (hang-up, error, bad fd).
POLL_DEAD = select.POLLERR | select.POLLHUP | select.POLLNVAL
# Linux also reports a peer's FIN without consuming data (elsewhere 0: POLL_DEAD remains).
POLLRDHUP = getattr(select, "POLLRDHUP", 0)


class HandshakeRefused(PermissionError):
    """Server side: the client did not prove the job secret (the caller drops it)."""


def recv_exact_into(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    """Fill ``view`` (any writable buffer) from ``sock``.

    ``deadline`` is a ``time.monotonic()`` instant; with None each read waits as long as
    the socket's own timeout allows.

    Raises:
        TimeoutError: the deadline (or the socket timeout) passed first.
        ConnectionError: the peer closed the connection before ``view`` was full.
        OSError: the connection failed.
    """
    view = memoryview(view).cast("B")
    got, total = 0, view.nbytes
    while got < total:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out with {got} of {total} bytes received")
            sock.settimeout(remaining)
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError(f"connection closed by the peer after {got} of {total} bytes")
        got += k


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """Exactly ``n`` bytes from ``sock``; raises like ``recv_exact_into``."""
    buf = bytearray(n)
    recv_exact_into(sock, memoryview(buf), deadline)
    return bytes(buf)


@dataclass(frozen=True)
class HandshakeLabels:
    """The two direction labels of one kind of channel, and the proofs made with them.

    ``opening`` is the client's first message; its last ``NONCE_BYTES`` are the client's
    nonce."""

    server: bytes
    client: bytes

    def server_proof(self, secret: str, opening: bytes) -> bytes:
        return challenge_response(secret, opening[-NONCE_BYTES:], self.server + opening)

    def check_server_proof(self, secret: str, opening: bytes, proof: bytes) -> bool:
        return check_challenge_response(
            secret, opening[-NONCE_BYTES:], proof, self.server + opening
        )

    def client_proof(self, secret: str, opening: bytes, server_nonce: bytes) -> bytes:
        return challenge_response(secret, server_nonce, self.client + opening)

    def check_client_proof(
        self, secret: str, opening: bytes, server_nonce: bytes, proof: bytes
    ) -> bool:
        return check_challenge_response(secret, server_nonce, proof, self.client + opening)


def client_handshake(
    sock: socket.socket,
    secret: str,
    opening: bytes,
    labels: HandshakeLabels,
    *,
    deadline: float | None = None,
    peer: str = "the peer",
) -> None:
    """Send ``opening`` (ending with a fresh ``make_nonce()``), check the server's proof
    of ``secret`` and answer its challenge. The connection is then authenticated both
    ways (the server may still refuse it with a message of the channel's own).

    Raises:
        ValueError: ``opening`` is shorter than a nonce.
        RendezvousAuthError: the server cannot prove the secret (the message names ``peer``).
        TimeoutError, ConnectionError, OSError: as ``recv_exact`` and ``socket.sendall``.
    """
    if len(opening) < NONCE_BYTES:
        raise ValueError("a handshake opening must end with the client nonce")
    if deadline is not None:
        # The sends wait at most until the deadline too (a tiny timeout once it passed).
        sock.settimeout(max(1e-3, deadline - time.monotonic()))
    sock.sendall(opening)
    challenge = recv_exact(sock, CHALLENGE_SIZE, deadline)
    server_nonce, proof = challenge[:NONCE_BYTES], challenge[NONCE_BYTES:]
    if not labels.check_server_proof(secret, opening, proof):
        raise RendezvousAuthError(f"{peer} does not know the job secret")
    sock.sendall(labels.client_proof(secret, opening, server_nonce))


def server_handshake(
    sock: socket.socket,
    secret: str,
    labels: HandshakeLabels,
    opening_size: int,
    parse: Callable[[bytes], T],
    *,
    deadline: float | None = None,
) -> T:
    """Read the client's opening (``opening_size`` bytes), hand it to ``parse`` (which
    raises to refuse it before anything is answered), prove ``secret`` and check the
    client's proof. Returns what ``parse`` returned.

    Raises:
        HandshakeRefused: the client's proof is wrong.
        whatever ``parse`` raises for an opening it refuses.
        TimeoutError, ConnectionError, OSError: as ``recv_exact`` and ``socket.sendall``.
    """
    opening = recv_exact(sock, opening_size, deadline)
    parsed = parse(opening)
    nonce = make_nonce()
    sock.sendall(nonce + labels.server_proof(secret, opening))
    proof = recv_exact(sock, PROOF_SIZE, deadline)
    if not labels.check_client_proof(secret, opening, nonce, proof):
        raise HandshakeRefused("bad proof of the job secret")
    return parsed


def wake_pipe() -> tuple[int, int]:
    """A non-blocking self-pipe ``(read fd, write fd)`` to wake a ``poll()`` from another
    thread (os.pipe2 is Linux-only). The caller closes both fds."""
    r, w = os.pipe()
    for fd in (r, w):
        os.set_blocking(fd, False)
    return r, w


__all__ = [
    "CHALLENGE_SIZE",
    "PROOF_SIZE",
    "NONCE_BYTES",
    "POLL_DEAD",
    "POLLRDHUP",
    "HandshakeLabels",
    "HandshakeRefused",
    "client_handshake",
    "server_handshake",
    "recv_exact",
    "recv_exact_into",
    "make_nonce",
    "wake_pipe",
]
