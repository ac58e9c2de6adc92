"""The per-job secret and the proofs of it that requests and handshakes carry.

The driver makes one random secret per job and hands it to workers and shards in
their environment (``ENV_SECRET``). Nothing sends the secret itself:

* a gRPC call carries two proofs in its metadata (``call_metadata``): one over the
  method, a timestamp and a fresh nonce, checked from the headers alone, so a call
  without the secret is refused before its body is read; and one over the nonce and a
  digest of the body, checked once the body is in. ``CallVerifier`` refuses a proof
  outside ``PROOF_WINDOW`` seconds of its own clock and a nonce it has already seen, so
  a request sniffed off the network cannot be replayed, nor its proofs moved to another
  method or body. (Hosts' clocks must agree within the window, as NTP keeps them.)
  Like etcd without TLS, this does not hide the traffic; it only authenticates it;
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


def call_metadata(
    secret: str, method: str, body: bytes, now: float | None = None
) -> tuple[tuple[str, str], tuple[str, str]]:
    """The metadata that proves ``secret`` for one call of ``method`` with ``body``."""
    stamp = int((time.time() if now is None else now) * 1000)
    nonce = secrets.token_hex(12)
    head = _mac(secret, f"call|{method}|{stamp}|{nonce}".encode())
    digest = hashlib.sha256(body).hexdigest()
    return (
        (RPC_METADATA_KEY, f"{stamp}.{nonce}.{head}"),
        (RPC_BODY_KEY, _mac(secret, f"body|{nonce}|{digest}".encode())),
    )


class CallVerifier:
    """Checks the proofs of ``call_metadata`` on a server; thread-safe.

    ``check_head`` runs on the headers alone and returns the call's nonce (or raises
    ``ProofRefused`` with the reason); ``check_body`` then checks the body proof. Seen
    nonces are kept for twice the window, so memory is bounded by the call rate."""

    def __init__(self, secret: str, window: float = PROOF_WINDOW, clock=time.time):
        self._secret = secret
        self._window = window
        self._clock = clock
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._next_purge = 0.0

    def check_head(self, method: str, token: str | None) -> str:
        """Raises ProofRefused unless ``token`` proves the secret for ``method`` now."""
        parts = token.split(".") if isinstance(token, str) else []
        if len(parts) != 3 or not parts[0].isdigit() or len(parts[1]) != 24:
            raise ProofRefused("missing or malformed job-secret proof")
        stamp, nonce, mac = parts
        expected = _mac(self._secret, f"call|{method}|{stamp}|{nonce}".encode())
        if not hmac.compare_digest(expected, mac):
            raise ProofRefused("wrong job secret")
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


def make_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def challenge_response(secret: str, nonce: bytes, label: bytes = b"") -> bytes:
    """The answer to a peer's ``nonce`` (``label`` separates the two directions)."""
    return hmac.new(secret.encode(), label + nonce, hashlib.sha256).digest()


def check_challenge_response(secret: str, nonce: bytes, answer: bytes, label: bytes = b"") -> bool:
    return hmac.compare_digest(challenge_response(secret, nonce, label), answer)
