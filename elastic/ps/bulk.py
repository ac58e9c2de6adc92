"""Payload bytes over plain TCP, next to the gRPC service (the "bulk" port): what the
client (``elastic.ps.client.bulk``) and the shard (``elastic.ps.shard.bulk``) share.

Every request goes through gRPC, where the job secret is checked on every call; the
bytes of a payload above the chunk size travel here, in parts (``protocol.Part``) of
uploads and downloads staged on the shard (``elastic.ps.shard.staging``). This is the
only path for large payloads. The reason is measured, not assumed: on loopback gRPC
Python moved a 64 MiB push+pull over 2 shards at about 0.3 of what a plain socket does,
even in 4 MiB parts over 4 connections, against about 0.5 here (benchmarks/ps_bench.py;
the gRPC-only path it was measured with is gone), because every gRPC message is copied
through HTTP/2 frames in Python-owned buffers. Here the client sends straight from the
gradient arrays and receives straight into the result arrays, and the shard receives
into its staging buffer and sends from the parameter arrays.

Connections are authenticated both ways by challenge/response with the job secret
(``rendezvous.auth``; like ring peers) before any request is read:

    client: MAGIC, client nonce        shard: shard nonce, HMAC(secret, "shard" + client nonce)
    client: HMAC(secret, "client" + shard nonce)

Then requests, one at a time per connection: 4-byte length + JSON header (a ``Part``),
and for ``put`` the part's bytes; the reply is 4-byte length + JSON, and for ``get``
the part's bytes. A shard error comes back as ``{"error": class name, "message": ...}``
and is raised as that class.
"""

from __future__ import annotations

import json
import socket
import struct

MAGIC = b"EPSBULK1"
SHARD_ROLE, CLIENT_ROLE = b"ps-bulk-shard", b"ps-bulk-client"
_LEN = struct.Struct("!I")
_MAX_HEADER = 1 << 20
# A connection idle this long is closed by the shard (a client that vanished without
# closing it would otherwise hold a thread forever); clients drop theirs earlier.
SERVER_IDLE = 600.0
CLIENT_IDLE = 300.0


def recv_into(sock: socket.socket, view: memoryview) -> None:
    view = view.cast("B")
    got = 0
    while got < view.nbytes:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("connection closed by peer")
        got += n


def recv(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_into(sock, memoryview(buf))
    return bytes(buf)


def send_json(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_json(sock: socket.socket) -> dict:
    (n,) = _LEN.unpack(recv(sock, _LEN.size))
    if n > _MAX_HEADER:
        raise ConnectionError(f"header of {n} bytes")
    return json.loads(recv(sock, n))
