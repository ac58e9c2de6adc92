"""Requests to a shard over gRPC, with large payloads moved in chunks.

Every request and reply is one ``rendezvous.rpc`` frame: a JSON header (which always
names the shard index the caller meant, so a stale address that now belongs to
another shard is refused) and a payload.

Why chunks and lanes: gRPC moves one 32 MiB message several times slower than a few
concurrent 4-8 MiB messages on separate connections (measured on loopback; see
benchmarks/ps_bench.py). So a payload above ``chunk_bytes`` is uploaded first in
parts (``Upload``) spread over ``lanes`` connections, and the request then names the
upload; a reply above the caller's ``inline_max`` is staged on the shard and fetched
the same way (``Download``, then ``Release``). ``Staging`` is the shard's half.

Payloads are lists of buffers ("pieces": a header and the arrays' own memory), never
joined into one big message: each part is built from the pieces it overlaps (the one
copy gRPC needs), and a fetched part can be written straight into its destination
arrays (``sink``).
"""
from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Executor
from typing import Callable, Sequence

import grpc

from elastic.ps.errors import PSTransferError, PSWrongShardError
from elastic.ps.memory import BufferPool, buffer
from rendezvous import auth
from rendezvous.rpc import UNLIMITED_MESSAGE_OPTIONS, frame, translate_rpc_error, unframe

SERVICE = "elastic.ps.Shard"
# (offset, length) in a reply payload -> the destination views for those bytes, in order
Targets = Callable[[int, int], list]


def as_pieces(payload) -> list[memoryview]:
    """A payload (bytes-like, or a list of them) as flat byte views."""
    if isinstance(payload, (list, tuple)):
        return [memoryview(p).cast("B") for p in payload]
    return [memoryview(payload).cast("B")]


def size_of(pieces: Sequence[memoryview]) -> int:
    return sum(p.nbytes for p in pieces)


def cut(pieces: Sequence[memoryview], offset: int, length: int) -> list[memoryview]:
    """The views covering bytes ``[offset, offset + length)`` of the pieces' concatenation."""
    out, pos, end = [], 0, offset + length
    for p in pieces:
        lo, hi = max(offset, pos), min(end, pos + p.nbytes)
        if lo < hi:
            out.append(p[lo - pos:hi - pos])
        pos += p.nbytes
        if pos >= end:
            break
    return out


class Lane:
    """One gRPC connection to a shard. The distinct ``lane`` channel argument stops gRPC
    from sharing one TCP connection between channels to the same address."""

    def __init__(self, address: str, secret: str, lane: int):
        self.address = address
        self._metadata = ((auth.RPC_METADATA_KEY, auth.rpc_token(secret)),)
        self._channel = grpc.insecure_channel(
            address, options=UNLIMITED_MESSAGE_OPTIONS + [("elastic.ps.lane", lane)])
        self._methods: dict[str, object] = {}
        self._lock = threading.Lock()

    def call(self, method: str, request: bytes, timeout: float) -> bytes:
        """Raises the shard's typed error, RendezvousAuthError, or
        RendezvousConnectionError (unreachable or past ``timeout``)."""
        with self._lock:
            stub = self._methods.get(method)
            if stub is None:
                stub = self._methods[method] = self._channel.unary_unary(f"/{SERVICE}/{method}")
        try:
            return stub(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise translate_rpc_error(exc, f"ps {method} at {self.address}") from None

    def close(self) -> None:
        self._channel.close()


class ShardLink:
    """Lanes to shard ``index`` at ``address``; ``request`` hides the chunking. With
    ``bulk`` the parts' bytes use the shard's bulk port when it has one (bulk.py)."""

    def __init__(self, index: int, address: str, secret: str, lanes: int = 1,
                 chunk_bytes: int = 4 << 20, pool: Executor | None = None, bulk: bool = False,
                 timeout: float = 30.0):
        self.index = index
        self.address = address
        self.chunk_bytes = chunk_bytes
        self._secret = secret
        self._lanes = [Lane(address, secret, k) for k in range(lanes)]
        self._pool = pool
        self._want_bulk = bulk
        self._timeout = timeout
        self._bulk = None
        self._bulk_checked = False
        self._bulk_lock = threading.Lock()

    def _bulk_client(self):
        """The shard's bulk plane, asked once per link (``Hello``); None without one."""
        if not self._want_bulk:
            return None
        with self._bulk_lock:
            if not self._bulk_checked:
                rh, _ = unframe(self._lanes[0].call("Hello", frame({"shard": self.index}),
                                                    self._timeout))
                if rh.get("bulk_port"):
                    from elastic.ps.bulk import BulkClient
                    host = self.address.rpartition(":")[0]
                    self._bulk = BulkClient(f"{host}:{rh['bulk_port']}", self._secret,
                                            len(self._lanes), self._timeout)
                self._bulk_checked = True
            return self._bulk

    def _parallel(self, calls: list) -> list:
        """Run the calls over the pool (serially without one); every call finishes
        before the first error is raised."""
        if self._pool is None or len(calls) == 1:
            return [fn() for fn in calls]
        futures = [self._pool.submit(fn) for fn in calls]
        results, first_error = [], None
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return results

    def _on_lane(self, k: int, method: str, request_fn, timeout: float, then=None):
        lane = self._lanes[k % len(self._lanes)]

        def run():
            reply = lane.call(method, request_fn(), timeout)
            return then(reply) if then is not None else reply
        return run

    def request(self, method: str, header: dict, payload=b"", timeout: float = 30.0,
                sink: Callable[[dict], Targets] | None = None):
        """One request; returns ``(reply header, reply payload)``. A staged reply is
        fetched in parts: into the views ``sink(reply header)`` names when given (the
        payload returned is then None), else into one buffer. Raises what
        ``Lane.call`` raises, and PSTransferError when staging failed on the shard."""
        header = {**header, "shard": self.index, "inline_max": self.chunk_bytes}
        pieces = as_pieces(payload)
        size = size_of(pieces)
        if size > self.chunk_bytes:
            bulk, upload, chunk = self._bulk_client(), uuid.uuid4().hex, self.chunk_bytes

            def part(k, off):
                h = {"shard": self.index, "id": upload, "offset": off, "total": size,
                     "length": min(chunk, size - off)}
                if bulk is not None:
                    return lambda: bulk.put(h, cut(pieces, off, chunk))
                return self._on_lane(k, "Upload", lambda: frame(h, cut(pieces, off, chunk)), timeout)
            self._parallel([part(k, off) for k, off in enumerate(range(0, size, chunk))])
            header["upload"] = upload
            pieces = []
        reply = self._lanes[0].call(method, frame(header, pieces), timeout)
        rh, body = unframe(reply)
        if "download" not in rh:
            return rh, body
        download, total = rh["download"], int(rh["total"])
        if sink is not None:
            targets, result = sink(rh), None
        else:
            result = buffer(total)

            def targets(off, length, buf=result):
                return [buf[off:off + length]]
        bulk = self._bulk_client()

        def fetch(k, off):
            h = {"shard": self.index, "id": download, "offset": off,
                 "length": min(self.chunk_bytes, total - off)}
            if bulk is not None:
                return lambda: bulk.get(h, targets(off, h["length"]))

            def store(part):
                data, pos = unframe(part)[1], 0
                for view in targets(off, h["length"]):
                    view[:] = data[pos:pos + view.nbytes]
                    pos += view.nbytes
            return self._on_lane(k, "Download", lambda: frame(h), timeout, store)
        try:
            self._parallel([fetch(k, off) for k, off in enumerate(range(0, total, self.chunk_bytes))])
        finally:
            try:
                self._lanes[0].call("Release", frame({"shard": self.index, "id": download}), timeout)
            except Exception:  # noqa: BLE001 - the shard drops it after its TTL anyway
                pass
        return rh, result

    def close(self) -> None:
        for lane in self._lanes:
            lane.close()
        if self._bulk is not None:
            self._bulk.close()


def parse_request(request: bytes, index: int) -> tuple[dict, memoryview]:
    """Shard side: the header and payload of a request. Raises PSWrongShardError when it
    was meant for another shard index."""
    header, body = unframe(request)
    if header.get("shard") != index:
        raise PSWrongShardError(f"this is ps shard {index}, not {header.get('shard')}")
    return header, body


class Staging:
    """The shard's half of chunked transfers; entries unused for ``ttl`` seconds vanish."""

    def __init__(self, ttl: float, clock=time.monotonic):
        self._ttl, self._clock = ttl, clock
        self._lock = threading.Lock()
        self._uploads: dict[str, list] = {}    # id -> [buffer, {offset: length}, last use]
        self._downloads: dict[str, list] = {}  # id -> [pieces, size, last use]
        self._pool = BufferPool()

    def _expire(self) -> None:
        limit = self._clock() - self._ttl
        for table in (self._uploads, self._downloads):
            for key in [k for k, v in table.items() if v[-1] < limit]:
                del table[key]

    def upload_view(self, header: dict) -> memoryview:
        """Where part ``header`` (id, offset, total) of an upload goes; call
        ``upload_done`` once it is written. Raises PSTransferError for a part outside
        the upload."""
        total, offset, length = int(header["total"]), int(header["offset"]), int(header["length"])
        if offset < 0 or length < 0 or offset + length > total:
            raise PSTransferError(f"upload part {offset}+{length} outside {total} bytes")
        with self._lock:
            self._expire()
            entry = self._uploads.get(header["id"])
            if entry is None:
                entry = self._uploads[header["id"]] = [self._pool.get(total), {}, 0.0]
            elif len(entry[0]) != total:
                raise PSTransferError(f"upload {header['id']} changed its size")
            entry[2] = self._clock()
            return entry[0][offset:offset + length]  # parts are disjoint: written unlocked

    def upload_done(self, header: dict) -> None:
        with self._lock:
            entry = self._uploads.get(header["id"])
            if entry is not None:
                entry[1][int(header["offset"])] = int(header["length"])

    def upload_part(self, header: dict, data: memoryview) -> None:
        """One part that came inside a request. Raises PSTransferError."""
        header = {**header, "length": len(data)}
        self.upload_view(header)[:] = data
        self.upload_done(header)

    def take_upload(self, upload_id: str) -> memoryview:
        """The whole uploaded payload (removed from staging). Raises PSTransferError when
        it is unknown (expired, shard restarted) or incomplete."""
        with self._lock:
            entry = self._uploads.pop(upload_id, None)
        if entry is None:
            raise PSTransferError(f"unknown upload {upload_id}")
        if sum(entry[1].values()) != len(entry[0]):
            raise PSTransferError(f"upload {upload_id} is incomplete")
        return entry[0]

    def offer(self, payload) -> str:
        pieces = as_pieces(payload)
        download = uuid.uuid4().hex
        with self._lock:
            self._expire()
            self._downloads[download] = [pieces, size_of(pieces), self._clock()]
        return download

    def download_pieces(self, header: dict) -> list[memoryview]:
        """The bytes ``[offset, offset + length)`` of download ``id``, uncopied.
        Raises PSTransferError for an unknown (expired, released) download."""
        with self._lock:
            entry = self._downloads.get(header["id"])
            if entry is None:
                raise PSTransferError(f"unknown download {header['id']}")
            entry[2] = self._clock()
        offset, length = int(header["offset"]), int(header["length"])
        if offset < 0 or length < 0 or offset + length > entry[1]:
            raise PSTransferError(f"download part {offset}+{length} outside {entry[1]} bytes")
        return cut(entry[0], offset, length)

    def download_part(self, header: dict) -> bytes:
        return frame({}, self.download_pieces(header))

    def release(self, download_id: str) -> None:
        with self._lock:
            self._downloads.pop(download_id, None)

    def reply(self, header: dict, payload, inline_max: int) -> bytes:
        """A reply frame; a payload above ``inline_max`` is staged for ``Download``."""
        pieces = as_pieces(payload)
        size = size_of(pieces)
        if size > inline_max:
            return frame({**header, "download": self.offer(pieces), "total": size})
        return frame(header, pieces)
