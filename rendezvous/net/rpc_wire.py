"""What both ends of a raw-bytes gRPC service (``rendezvous.net.rpc``) agree on: the
framing of a message (``frame``/``unframe``: a JSON header and binary blobs in one
message), the request that does not parse (``MalformedRequest``), and the names and
separators the server's answers carry to the client (``rendezvous.net.rpc_client``).

Why apart: the ps shards, their clients and the embedded store frame their messages
the same way whether they serve or call, and the client's reading of an error must
match the server's writing of it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable

from rendezvous.errors import RendezvousError

#: between a typed error's registered name and its message (FAILED_PRECONDITION details)
ERROR_SEPARATOR = "|"
#: the method every ``RpcServer`` answers with its incarnation, without a proof
INCARNATION_METHOD = "Incarnation"
# The trailer of a refusal of a proof made for another incarnation of the server.
REFUSED_KEY = "x-elastic-refused"
REFUSED_INCARNATION = "incarnation"


def frame(header: dict, blobs: Iterable[bytes | memoryview] = ()) -> bytes:
    """One message: 4-byte header length, the JSON header, then the blobs back to back.

    The header should say how long each blob is (the caller's schema decides how)."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([struct.pack("!I", len(head)), head, *blobs])


def unframe(message: bytes) -> tuple[dict, memoryview]:
    """Inverse of ``frame``: the header and a zero-copy view of the blob bytes.

    Raises:
        MalformedRequest: the message is shorter than its header says, or the header is
            not a JSON object."""
    view = memoryview(message)
    try:
        (head_len,) = struct.unpack_from("!I", view, 0)
        if 4 + head_len > len(view):
            raise ValueError(f"header of {head_len} bytes in a message of {len(view)}")
        header = json.loads(bytes(view[4 : 4 + head_len]))
    except (struct.error, ValueError, RecursionError) as exc:  # RecursionError: deep nesting
        raise MalformedRequest(f"malformed message: {exc}") from None
    if not isinstance(header, dict):
        raise MalformedRequest("malformed message: the header is not an object")
    return header, view[4 + head_len :]


class MalformedRequest(RendezvousError, ValueError):
    """A request that does not parse; the server answers INVALID_ARGUMENT."""
