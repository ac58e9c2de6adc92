"""Requests to one shard: gRPC for every request, the shard's bulk port for large payloads.

Every request and reply is one ``rendezvous.net.rpc`` frame: a JSON header (``protocol``:
an ``Envelope`` naming the shard index the caller meant, so a stale address that now
belongs to another shard is refused, merged with the method's arguments) and a
payload. Its proof of the secret is made for one shard process, the incarnation in the
shard's record (``where``): a later process at the address (a restart) refuses it with
``StaleIncarnationError``, and the caller reads the record again.

A payload above ``chunk_bytes`` does not ride in the request: it is first put in parts
through the shard's bulk port (``bulk.py``; up to ``lanes`` parts at once, because a
few concurrent parts move faster than one stream), and the request then names the
upload. A reply above ``chunk_bytes`` is staged on the shard, fetched the same way,
and released. Payloads are lists of buffers ("pieces": a header and the arrays' own
memory), never joined into one big message: each part is sent from the pieces it
overlaps, and a fetched part can be written straight into its destination arrays
(``sink``).
"""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Callable

from ps.client.bulk import BulkClient
from ps.memory import buffer
from ps.protocol import SERVICE, Empty, Envelope, Hello, Part, Record, ReleaseArgs, Staged
from ps.wire import as_pieces, cut, size_of
from rendezvous.net import auth
from rendezvous.net.rpc_client import RpcClient
from rendezvous.net.rpc_wire import frame, unframe
from rendezvous.net.url import Endpoint
from rendezvous.schema.ps import ShardInfo

log = logging.getLogger("ps.client.link")

# (offset, length) in a reply payload -> the destination views for those bytes, in order
Targets = Callable[[int, int], list]


def where(target: str | ShardInfo) -> tuple[str, str | None]:
    """A shard's address and incarnation from its record, or from an address alone
    (incarnation None: asked of the shard, as for a record of an older release, which
    names none)."""
    if isinstance(target, ShardInfo):
        known = auth.is_incarnation(target.incarnation)
        return target.address, target.incarnation if known else None
    return target, None


@dataclass(frozen=True)
class LinkSettings:
    """How a ``ShardLink`` talks to its shard: at most ``lanes`` parts at once, each part
    at most ``chunk_bytes``, every call within ``timeout`` seconds."""

    lanes: int = 1
    chunk_bytes: int = 4 << 20
    timeout: float = 30.0


class ShardLink:
    """Requests to shard ``index`` at ``address``, proofs made for its process
    ``incarnation`` (None: asked of it; ``RpcClient``); ``request`` hides the chunking.
    Parts run on ``pool`` (serially without one), as ``settings`` says."""

    def __init__(
        self,
        index: int,
        address: str,
        secret: str,
        settings: LinkSettings = LinkSettings(),
        *,
        pool: Executor | None = None,
        incarnation: str | None = None,
    ):
        self.index = index
        self.address = address
        self.incarnation = incarnation
        self.chunk_bytes = settings.chunk_bytes
        self._secret = secret
        self._lanes = settings.lanes
        self._pool = pool
        self._timeout = settings.timeout
        self._rpc = RpcClient(address, SERVICE, secret, settings.timeout, incarnation)
        self._bulk: BulkClient | None = None
        self._bulk_lock = threading.Lock()

    def _call(self, method: str, header: dict, pieces=(), timeout: float | None = None):
        return unframe(self._rpc.call(method, frame(header, pieces), timeout))

    def _bulk_client(self) -> BulkClient:
        """The shard's bulk port, asked once per link (``Hello``).

        Raises:
            RendezvousConnectionError, RendezvousAuthError, PSWrongShardError: as
                ``request``."""
        with self._bulk_lock:
            if self._bulk is None:
                header, _ = self._call("Hello", Envelope(self.index).to_dict())
                hello = Hello.from_dict(header)
                host = Endpoint.parse(self.address, f"ps shard {self.index}'s address").host
                self._bulk = BulkClient(
                    str(Endpoint(host, hello.bulk_port)), self._secret, self._lanes, self._timeout
                )
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
            except BaseException as exc:  # noqa: BLE001 - raised below, once all have finished
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return results

    def _upload(self, pieces: list[memoryview], size: int) -> str:
        """Put ``pieces`` through the bulk port in parts; returns the upload's id."""
        bulk, upload, chunk = self._bulk_client(), uuid.uuid4().hex, self.chunk_bytes

        def put(offset: int):
            part = Part(upload, offset, min(chunk, size - offset), size)
            return lambda: bulk.put(part, cut(pieces, offset, chunk))

        self._parallel([put(offset) for offset in range(0, size, chunk)])
        return upload

    def _download(self, staged: Staged, targets: Targets, timeout: float) -> None:
        """Get a staged reply payload through the bulk port into ``targets``, then
        release it on the shard."""
        bulk, total, download = self._bulk_client(), staged.total, str(staged.download)

        def get(offset: int):
            part = Part(download, offset, min(self.chunk_bytes, total - offset))
            return lambda: bulk.get(part, targets(offset, part.length))

        try:
            self._parallel([get(offset) for offset in range(0, total, self.chunk_bytes)])
        finally:
            try:
                self._call(
                    "Release",
                    {**Envelope(self.index).to_dict(), **ReleaseArgs(download).to_dict()},
                    timeout=timeout,
                )
            except Exception:
                log.debug("release of download %s failed", download, exc_info=True)

    def request(
        self,
        method: str,
        args: Record | None = None,
        payload=b"",
        timeout: float = 30.0,
        sink: Callable[[dict], Targets] | None = None,
    ):
        """One request; returns ``(reply header, reply payload)``. A staged reply is
        fetched in parts: into the views ``sink(reply header)`` names when given (the
        payload returned is then None), else into one buffer.

        Raises:
            StaleIncarnationError: another process than ``incarnation`` serves at the
                address (the shard restarted): nothing ran; read its record again.
            RendezvousConnectionError: the shard is unreachable or past ``timeout``.
            RendezvousAuthError: the shard does not know the job secret.
            PSError: the shard's typed error (PSWrongShardError for a stale address,
                PSTransferError when staging failed on the shard, ...)."""
        envelope = Envelope(self.index, inline_max=self.chunk_bytes)
        pieces = as_pieces(payload)
        size = size_of(pieces)
        if size > self.chunk_bytes:
            envelope = replace(envelope, upload=self._upload(pieces, size))
            pieces = []
        header = {**envelope.to_dict(), **(args or Empty()).to_dict()}
        reply_header, body = self._call(method, header, pieces, timeout)
        staged = Staged.from_dict(reply_header)
        if staged.download is None:
            return reply_header, body
        result = None
        if sink is not None:
            targets = sink(reply_header)
        else:
            result = buffer(staged.total)

            def targets(offset: int, length: int, buf=result) -> list:
                return [buf[offset : offset + length]]

        self._download(staged, targets, timeout)
        return reply_header, result

    def close(self) -> None:
        self._rpc.close()
        if self._bulk is not None:
            self._bulk.close()
