"""The per-job secret and the proofs of it that requests and handshakes carry.

The driver makes one random secret per job and hands it to workers and shards in
their environment (``ENV_SECRET``). Nothing sends the secret itself:

* a gRPC call carries two proofs in its metadata (``call_metadata``): one over the
  method, the incarnation of the server it is meant for, a timestamp and a fresh
  nonce, checked from the headers alone, so a call without the secret is refused
  before its body is read; and one over the nonce and a digest of the body, checked
  once the body is in. ``CallVerifier`` refuses a proof outside ``PROOF_WINDOW``
  seconds of its own clock and a nonce it has already seen, so a request sniffed off
  the network cannot be replayed, nor its proofs moved to another method or body.
  (Hosts' clocks must agree within the window, as NTP keeps them.) The seen nonces
  live in the server process's memory, so a restarted server would take a request
  replayed from before its restart; the incarnation closes that: every server process
  draws a fresh one when it starts (``new_incarnation``), and refuses a proof made for
  any other (``OtherIncarnation``), so what a proof allows is one call to one process.
  Clients learn a server's incarnation where they learn its address (a ps shard's
  record in the store), or ask the server for it (``rendezvous.net.rpc``). Like etcd
  without TLS, this does not hide the traffic; it only authenticates it;
* a ring-peer handshake is challenge/response: each side sends a random nonce
  and answers the other's with ``challenge_response(secret, nonce)``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time

from rendezvous.env import ENV_SECRET

RPC_METADATA_KEY = "x-elastic-auth"
NONCE_BYTES = 16
RESPONSE_BYTES = hashlib.sha256().digest_size


def make_secret() -> str:
    """A fresh random job secret (hex, 256 bits)."""
    return secrets.token_hex(32)


def secret_fingerprint(secret: str) -> str:
    """A fingerprint of the job secret that says nothing of it: the leader writes it in
    its persisted state, so a successor and every worker can tell that they hold another
    secret than the job's and say so (instead of failing every handshake in silence)."""
    return hashlib.sha256(b"elastic-job-secret:" + secret.encode()).hexdigest()[:16]


def secret_from_env(environ=os.environ) -> str | None:
    """The job secret from the environment, or None when it is not set."""
    return environ.get(ENV_SECRET) or None


#: seconds a call's proof stays valid either side of the server's clock
PROOF_WINDOW = 60.0
RPC_BODY_KEY = "x-elastic-body"


def _mac(secret: str, data: bytes) -> str:
    return hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


#: hex digits of a server's incarnation (64 random bits: two processes of one job never
#: draw the same)
INCARNATION_CHARS = 16


def new_incarnation() -> str:
    """A fresh incarnation for a server process that starts (random, never reused)."""
    return secrets.token_hex(INCARNATION_CHARS // 2)


def is_incarnation(text: object) -> bool:
    """Whether ``text`` is spelt as an incarnation (``new_incarnation``)."""
    return (
        isinstance(text, str)
        and len(text) == INCARNATION_CHARS
        and all(c in "0123456789abcdef" for c in text)
    )


def _head(method: str, incarnation: str, stamp: str, nonce: str) -> bytes:
    return f"call|{method}|{incarnation}|{stamp}|{nonce}".encode()


def call_metadata(
    secret: str, method: str, body: bytes, incarnation: str, now: float | None = None
) -> tuple[tuple[str, str], tuple[str, str]]:
    """The metadata that proves ``secret`` for one call of ``method`` with ``body`` to
    the server process of ``incarnation`` (and no other, nor a later one at its address).

    Raises:
        ValueError: ``incarnation`` is not spelt as one (``is_incarnation``)."""
    if not is_incarnation(incarnation):
        raise ValueError(f"not a server incarnation: {incarnation!r}")
    stamp = str(int((time.time() if now is None else now) * 1000))
    nonce = secrets.token_hex(12)
    head = _mac(secret, _head(method, incarnation, stamp, nonce))
    digest = hashlib.sha256(body).hexdigest()
    return (
        # The incarnation travels in the clear (it is no secret; the MAC covers it), so
        # a server tells a proof made for a process before it from one without the secret.
        (RPC_METADATA_KEY, f"{stamp}.{nonce}.{incarnation}.{head}"),
        (RPC_BODY_KEY, _mac(secret, f"body|{nonce}|{digest}".encode())),
    )


class CallVerifier:
    """Checks the proofs of ``call_metadata`` on the server process of ``incarnation``;
    thread-safe.

    ``check_head`` runs on the headers alone and returns the call's nonce (or raises
    ``ProofRefused`` with the reason); ``check_body`` then checks the body proof. Seen
    nonces are kept for twice the window, so memory is bounded by the call rate. They
    are kept in memory only: what keeps a call from before this process started (a
    restart) from being replayed to it is the incarnation, which no earlier process
    had.

    Raises:
        ValueError: ``incarnation`` is not spelt as one (``is_incarnation``)."""

    def __init__(
        self, secret: str, incarnation: str, window: float = PROOF_WINDOW, clock=time.time
    ):
        if not is_incarnation(incarnation):
            raise ValueError(f"not a server incarnation: {incarnation!r}")
        self._secret = secret
        self.incarnation = incarnation
        self._window = window
        self._clock = clock
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._next_purge = 0.0

    def check_head(self, method: str, token: str | None) -> str:
        """The call's nonce, once ``token`` proves the secret for ``method``, to this
        server's incarnation, now, for the first time.

        Raises:
            OtherIncarnation: a proof of the secret, made for another incarnation (a
                server process before this one: a replay across a restart, or a caller
                whose record of the server is stale).
            ProofRefused: no proof, a malformed one, the wrong secret, outside the
                window, or a nonce already used."""
        parts = token.split(".") if isinstance(token, str) else []
        if (
            len(parts) != 4
            or not parts[0].isdigit()
            or len(parts[1]) != 24
            or not is_incarnation(parts[2])
        ):
            raise ProofRefused("missing or malformed job-secret proof")
        stamp, nonce, incarnation, mac = parts
        # The MAC is checked over the incarnation the proof names, before that is
        # compared with this server's: so a wrong secret reads "wrong job secret"
        # whatever it names, and "another incarnation" is said only of a real proof.
        expected = _mac(self._secret, _head(method, incarnation, stamp, nonce))
        if not hmac.compare_digest(expected, mac):
            raise ProofRefused("wrong job secret")
        if incarnation != self.incarnation:
            raise OtherIncarnation(
                f"proof made for another incarnation of this server ({incarnation}, not "
                f"{self.incarnation}): a request replayed from before a restart, or a "
                "caller whose record of this server is stale"
            )
        now = self._clock()
        if abs(now - int(stamp) / 1000) > self._window:
            raise ProofRefused(
                f"proof outside the {self._window:g}s window of this server's "
                "clock (a replay, or clocks that disagree)"
            )
        with self._lock:
            if nonce in self._seen:
                raise ProofRefused("replayed request (nonce already used)")
            self._seen[nonce] = now + 2 * self._window
            if now >= self._next_purge:
                self._seen = {n: t for n, t in self._seen.items() if t > now}
                self._next_purge = now + self._window
        return nonce

    def check_body(self, nonce: str, body: bytes, mac: str | None) -> None:
        """Raises ProofRefused unless ``mac`` binds ``body`` to the call's ``nonce``."""
        digest = hashlib.sha256(body).hexdigest()
        expected = _mac(self._secret, f"body|{nonce}|{digest}".encode())
        if not isinstance(mac, str) or not hmac.compare_digest(expected, mac):
            raise ProofRefused("the request body does not match its proof")


class ProofRefused(Exception):
    """A call's proof of the job secret is missing, wrong, stale or replayed."""


class OtherIncarnation(ProofRefused):
    """A proof of the job secret made for another incarnation of the server (a process
    before this one at its address, or another server): nothing of the call runs."""


def make_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def challenge_response(secret: str, nonce: bytes, label: bytes = b"") -> bytes:
    """The answer to a peer's ``nonce`` (``label`` separates the two directions)."""
    return hmac.new(secret.encode(), label + nonce, hashlib.sha256).digest()


def check_challenge_response(secret: str, nonce: bytes, answer: bytes, label: bytes = b"") -> bool:
    return hmac.compare_digest(challenge_response(secret, nonce, label), answer)
