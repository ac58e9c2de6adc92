"""Payload bytes over plain TCP, next to the gRPC service (the "bulk" port): what the
client (``ps.client.bulk``) and the shard (``ps.shard.bulk``) share.

Every request goes through gRPC, where the job secret is checked on every call; the
bytes of a payload above the chunk size travel here, in parts (``protocol.Part``) of
uploads and downloads staged on the shard (``ps.shard.staging``). This is the
only path for large payloads. The reason is measured, not assumed: on loopback gRPC
Python moved a 64 MiB push+pull over 2 shards at about 0.3 of what a plain socket does,
even in 4 MiB parts over 4 connections, against about 0.5 here (benchmarks/ps_bench.py;
the gRPC-only path it was measured with is gone), because every gRPC message is copied
through HTTP/2 frames in Python-owned buffers. Here the client sends straight from the
gradient arrays and receives straight into the result arrays, and the shard receives
into its staging buffer and sends from the parameter arrays.

Connections are authenticated both ways with the job secret before any request is read,
by the handshake every worker channel uses (``elastic.netio``; the ring's too): the
client's opening is ``MAGIC`` + its nonce, and ``HANDSHAKE`` holds this channel's labels.

Then requests, one at a time per connection: 4-byte length + JSON header (a ``Part``),
and for ``put`` the part's bytes; the reply is 4-byte length + JSON, and for ``get``
the part's bytes. A shard error comes back as ``{"error": class name, "message": ...}``
and is raised as that class.
"""

from __future__ import annotations

import json
import socket
import struct

from elastic.netio import NONCE_BYTES, HandshakeLabels, recv_exact

MAGIC = b"EPSBULK2"  # 2: the proofs bind the whole opening (elastic.netio)
HANDSHAKE = HandshakeLabels(server=b"ps-bulk-shard\x00", client=b"ps-bulk-client\x00")
OPENING_SIZE = len(MAGIC) + NONCE_BYTES
_LEN = struct.Struct("!I")
_MAX_HEADER = 1 << 20
# A connection idle this long is closed by the shard (a client that vanished without
# closing it would otherwise hold a thread forever); clients drop theirs earlier.
SERVER_IDLE = 600.0
CLIENT_IDLE = 300.0


def send_json(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_json(sock: socket.socket) -> dict:
    (n,) = _LEN.unpack(recv_exact(sock, _LEN.size))
    if n > _MAX_HEADER:
        raise ConnectionError(f"header of {n} bytes")
    return json.loads(recv_exact(sock, n))


__all__ = [
    "CLIENT_IDLE",
    "HANDSHAKE",
    "MAGIC",
    "OPENING_SIZE",
    "SERVER_IDLE",
    "recv_json",
    "send_json",
]
