"""Requests to a shard over gRPC, with large payloads moved in chunks.

Every request and reply is one ``rendezvous.rpc`` frame: a JSON header (which always
names the shard index the caller meant, so a stale address that now belongs to
another shard is refused) and one payload blob.

Why chunks and lanes: gRPC moves one 32 MiB message several times slower than a few
concurrent 4 MiB messages on separate connections (measured on loopback; see
benchmarks/ps_bench.py). So a payload above ``chunk_bytes`` is uploaded first in
parts (``Upload``), spread over ``lanes`` connections, and the request then names
the upload; a reply above the caller's ``inline_max`` is staged on the shard and
fetched the same way (``Download``, then ``Release``). ``Staging`` is the shard's half.
"""
from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Executor

import grpc

from elastic.ps.errors import PSTransferError, PSWrongShardError
from rendezvous import auth
from rendezvous.rpc import UNLIMITED_MESSAGE_OPTIONS, frame, translate_rpc_error, unframe

SERVICE = "elastic.ps.Shard"


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
    """Lanes to shard ``index`` at ``address``; ``request`` hides the chunking."""

    def __init__(self, index: int, address: str, secret: str, lanes: int = 1,
                 chunk_bytes: int = 4 << 20, pool: Executor | None = None):
        self.index = index
        self.address = address
        self.chunk_bytes = chunk_bytes
        self._lanes = [Lane(address, secret, k) for k in range(lanes)]
        self._pool = pool

    def _spread(self, calls) -> list:
        """Run (method, request) calls over the lanes in parallel (serially without a pool)."""
        if self._pool is None or len(calls) == 1:
            return [fn() for fn in calls]
        futures = [self._pool.submit(fn) for fn in calls]
        results, first_error = [], None
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as exc:  # wait for every part before raising
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return results

    def _lane_call(self, k: int, method: str, request: bytes, timeout: float):
        lane = self._lanes[k % len(self._lanes)]
        return lambda: lane.call(method, request, timeout)

    def request(self, method: str, header: dict, payload=b"", timeout: float = 30.0):
        """One request; returns ``(reply header, reply payload)``. Raises what
        ``Lane.call`` raises, and PSTransferError when staging failed on the shard."""
        header = {**header, "shard": self.index, "inline_max": self.chunk_bytes}
        size = memoryview(payload).nbytes
        if size > self.chunk_bytes:
            upload = uuid.uuid4().hex
            view = memoryview(payload).cast("B")
            calls = [self._lane_call(k, "Upload", frame(
                {"shard": self.index, "id": upload, "offset": off, "total": size},
                [view[off:off + self.chunk_bytes]]), timeout)
                for k, off in enumerate(range(0, size, self.chunk_bytes))]
            self._spread(calls)
            header["upload"] = upload
            payload = b""
        reply = self._lanes[0].call(method, frame(header, [payload]), timeout)
        rh, body = unframe(reply)
        if "download" not in rh:
            return rh, body
        download, total = rh["download"], int(rh["total"])
        buf = bytearray(total)
        offsets = list(range(0, total, self.chunk_bytes))
        calls = [self._lane_call(k, "Download", frame(
            {"shard": self.index, "id": download, "offset": off,
             "length": min(self.chunk_bytes, total - off)}), timeout)
            for k, off in enumerate(offsets)]
        try:
            for off, part in zip(offsets, self._spread(calls)):
                _, data = unframe(part)
                buf[off:off + len(data)] = data
        finally:
            try:
                self._lanes[0].call("Release", frame({"shard": self.index, "id": download}), timeout)
            except Exception:  # noqa: BLE001 - the shard drops it after its TTL anyway
                pass
        return rh, buf

    def close(self) -> None:
        for lane in self._lanes:
            lane.close()


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
        self._downloads: dict[str, list] = {}  # id -> [bytes, last use]

    def _expire(self) -> None:
        limit = self._clock() - self._ttl
        for table in (self._uploads, self._downloads):
            for key in [k for k, v in table.items() if v[-1] < limit]:
                del table[key]

    def upload_part(self, header: dict, data: memoryview) -> None:
        total, offset = int(header["total"]), int(header["offset"])
        if offset < 0 or offset + len(data) > total:
            raise PSTransferError(f"upload part {offset}+{len(data)} outside {total} bytes")
        with self._lock:
            self._expire()
            entry = self._uploads.get(header["id"])
            if entry is None:
                entry = self._uploads[header["id"]] = [bytearray(total), {}, 0.0]
            entry[2] = self._clock()
        entry[0][offset:offset + len(data)] = data  # parts are disjoint: no lock for the copy
        with self._lock:
            entry[1][offset] = len(data)

    def take_upload(self, upload_id: str) -> bytearray:
        """The whole uploaded payload (removed from staging). Raises PSTransferError when
        it is unknown (expired, shard restarted) or incomplete."""
        with self._lock:
            entry = self._uploads.pop(upload_id, None)
        if entry is None:
            raise PSTransferError(f"unknown upload {upload_id}")
        if sum(entry[1].values()) != len(entry[0]):
            raise PSTransferError(f"upload {upload_id} is incomplete")
        return entry[0]

    def offer(self, data: bytes) -> str:
        download = uuid.uuid4().hex
        with self._lock:
            self._expire()
            self._downloads[download] = [data, self._clock()]
        return download

    def download_part(self, header: dict) -> bytes:
        with self._lock:
            entry = self._downloads.get(header["id"])
            if entry is None:
                raise PSTransferError(f"unknown download {header['id']}")
            entry[1] = self._clock()
        offset, length = int(header["offset"]), int(header["length"])
        return frame({}, [memoryview(entry[0])[offset:offset + length]])

    def release(self, download_id: str) -> None:
        with self._lock:
            self._downloads.pop(download_id, None)

    def reply(self, header: dict, payload, inline_max: int) -> bytes:
        """A reply frame; a payload above ``inline_max`` is staged for ``Download``."""
        size = memoryview(payload).nbytes
        if size > inline_max:
            return frame({**header, "download": self.offer(payload), "total": size})
        return frame(header, [payload])
