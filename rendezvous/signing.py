"""Signed records: what makes a record in the store the job's own (``RecordSigner``).

The embedded store refuses every call without a proof of the job's secret, so what is
in it was written by the job. etcd knows nothing of the secret: anyone who can reach
it can write a record, and a record that makes a process act (an assignment, a seat, a
plan, a failure report...) would run that stranger's command or kill a healthy worker.
So every value a client of the job writes carries an HMAC under a key derived from the
job's secret, over the record's key (which names the job: ``/elastic/<job>/...``) and
its value (which holds the record's term or round where it has one); a reader of the
job checks it and ignores what does not carry the job's. The same holds on both
backends: one route, whatever store the job runs on.

What the signature does not do: it does not stop a stranger from deleting or
overwriting a record (that costs the job a round, or the job; only etcd's own
authentication or TLS keeps strangers out, see DESIGN "Security"), nor replaying a
record of the job at its own key: readers refuse what is older than what they have
seen (a plan's or assignment's term, a report's round in its key).

Format: the value, then ``\\n#sig1 `` and 64 hex digits (readable with etcdctl).
"""

from __future__ import annotations

import hashlib
import hmac

from rendezvous.keys import ROOT

TAG = b"\n#sig1 "
MAC_CHARS = 2 * hashlib.sha256().digest_size
#: bytes a signature adds to a value
OVERHEAD = len(TAG) + MAC_CHARS
_KEY_PURPOSE = b"elastic: signatures of store records, v1"


class RecordSigner:
    """Signs values for the job whose secret it holds, and checks them."""

    def __init__(self, secret: str):
        # A key of its own: a record's signature and a call's proof never stand for each other.
        self._key = hmac.new(secret.encode(), _KEY_PURPOSE, hashlib.sha256).digest()

    def _mac(self, key: str, value: bytes) -> bytes:
        encoded = key.encode()
        message = b"%d:" % len(encoded) + encoded + value
        return hmac.new(self._key, message, hashlib.sha256).hexdigest().encode()

    def sign(self, key: str, value: bytes) -> bytes:
        """``value`` as written at ``key``: with its signature appended."""
        return value + TAG + self._mac(key, value)

    def open(self, key: str, stored: bytes) -> bytes | None:
        """The value signed at ``key`` by a holder of the secret, or None when ``stored``
        carries no signature, or one made for another key, value or secret."""
        body, mac = split(stored)
        if mac is None or not hmac.compare_digest(mac, self._mac(key, body)):
            return None
        return body


def split(stored: bytes) -> tuple[bytes, bytes | None]:
    """A stored value's body and signature (None when it carries none); checks nothing."""
    if len(stored) < OVERHEAD or stored[-OVERHEAD:-MAC_CHARS] != TAG:
        return stored, None
    return stored[:-OVERHEAD], stored[-MAC_CHARS:]


def record_kind(key: str) -> str:
    """What kind of record ``key`` is, for the refusal's line: its first part below the
    job's prefix (``assign`` for ``/elastic/<job>/assign/<host>/<id>``), or the key."""
    parts = key.split("/")
    if len(parts) >= 4 and "/" + parts[1] == ROOT:
        return parts[3] or key
    return key
