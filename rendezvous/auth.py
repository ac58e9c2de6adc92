"""The per-job secret and the proofs of it that requests and handshakes carry.

The driver makes one random secret per job and hands it to workers and shards in
their environment (``ENV_SECRET``). Nothing sends the secret itself:

* a gRPC call carries ``rpc_token(secret)``, an HMAC of a fixed label, in its
  metadata (a bearer token: it proves knowledge of the secret to a server on
  the job's network; like etcd without TLS it does not protect against a
  sniffer on that network);
* a ring-peer handshake is challenge/response: each side sends a random nonce
  and answers the other's with ``challenge_response(secret, nonce)``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from rendezvous.env import ENV_SECRET

RPC_METADATA_KEY = "x-elastic-auth"
NONCE_BYTES = 16
RESPONSE_BYTES = hashlib.sha256().digest_size


def make_secret() -> str:
    """A fresh random job secret (hex, 256 bits)."""
    return secrets.token_hex(32)


def secret_from_env(environ=os.environ) -> str | None:
    """The job secret from the environment, or None when it is not set."""
    return environ.get(ENV_SECRET) or None


def rpc_token(secret: str) -> str:
    """The proof of the secret that every gRPC request carries."""
    return hmac.new(secret.encode(), b"elastic-rpc-v1", hashlib.sha256).hexdigest()


def check_rpc_token(secret: str, token: str | None) -> bool:
    """True when ``token`` proves ``secret`` (constant-time compare)."""
    return token is not None and hmac.compare_digest(rpc_token(secret), token)


def make_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def challenge_response(secret: str, nonce: bytes, label: bytes = b"") -> bytes:
    """The answer to a peer's ``nonce`` (``label`` separates the two directions)."""
    return hmac.new(secret.encode(), label + nonce, hashlib.sha256).digest()


def check_challenge_response(secret: str, nonce: bytes, answer: bytes, label: bytes = b"") -> bool:
    return hmac.compare_digest(challenge_response(secret, nonce, label), answer)
