"""``TcpRing``: the collectives as a pipelined ring over two TCP connections.

Each member sends on the connection to its right neighbour and receives on the one from
its left (both non-blocking; the communicator made them). Every collective is a queue of
buffers to send and a queue of buffers to fill, pumped by ``pump``: callbacks run as
each receive buffer fills and queue more sends, so the kernel keeps moving bytes into
and out of the socket buffers while a chunk is being reduced.

Algorithms (n members, rank r):

* allreduce: reduce-scatter then allgather over n ring segments, each cut into chunks
  of ``chunk_bytes`` (2(n-1)/n of the array crosses each link; the optimum for a ring);
* broadcast: the root's dtype/shape then its bytes flow round the ring, chunk by chunk;
* allgather: dtypes and shapes first (``exchange``), then every block goes n-1 hops;
* barrier: an ``exchange`` of empty blobs.

Every collective begins with each member sending its ``OpHeader`` to the right and
checking its left neighbour's, so ranks that run different calls find out
(``Mismatch``) instead of exchanging garbage. A failed connection raises ``PeerGone``
naming the neighbour; the communicator decides whether it closed or was lost. No wait
is longer than a second without asking ``check`` whether the communicator broke.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import numpy as np

from elastic.comm import layout, wire
from elastic.comm.base import CommSettings
from elastic.comm.transports.base import Check, Mismatch, PeerGone, Transport, gather_layout
from elastic.netio import POLL_DEAD

RecvItem = list  # [memoryview to fill, callback or None]: the view shrinks as bytes come


def pump(
    send_sock: socket.socket,
    recv_sock: socket.socket,
    sendq: deque,
    recvq: deque,
    check: Check,
    right: int,
    left: int,
    poller: Any,
    deadline: float | None = None,
) -> None:
    """Send ``sendq`` (memoryviews) on ``send_sock`` and fill ``recvq`` (``RecvItem``s,
    in order) from ``recv_sock``, both non-blocking, until both queues are empty.
    Callbacks run when their buffer is full and may append to either queue. ``poller``
    is a ``select.poll()`` object kept for these two sockets.

    Raises:
        PeerGone: a connection failed (``right`` or ``left`` names the neighbour).
        Interrupted: from ``check``, when the communicator broke meanwhile.
        TimeoutError: ``deadline`` (monotonic) passed while waiting.
        Mismatch: from a callback that found the peers disagree.
    """
    sfd, rfd = send_sock.fileno(), recv_sock.fileno()
    while sendq or recvq:
        progressed = False
        while sendq:
            mv = sendq[0]
            try:
                k = send_sock.send(mv)
            except BlockingIOError:
                break
            except OSError as e:
                check()
                raise PeerGone(right, str(e) or type(e).__name__) from None
            progressed = True
            if k < len(mv):
                sendq[0] = mv[k:]
                break
            sendq.popleft()
        while recvq:
            item = recvq[0]
            try:
                k = recv_sock.recv_into(item[0])
            except BlockingIOError:
                break
            except OSError as e:
                check()
                raise PeerGone(left, str(e) or type(e).__name__) from None
            if k == 0:
                check()
                raise PeerGone(left, "connection closed")
            progressed = True
            if k < len(item[0]):
                item[0] = item[0][k:]
                continue
            recvq.popleft()
            if item[1] is not None:
                item[1]()
        if progressed:
            continue
        check()
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("the ring did not answer in time")
        poller.register(sfd, select.POLLOUT if sendq else 0)
        poller.register(rfd, select.POLLIN if recvq else 0)
        for fd, ev in poller.poll(1000):
            if ev & POLL_DEAD:
                check()
                if fd == rfd and not recvq:
                    raise PeerGone(left, "connection closed")
                if fd == sfd and not sendq:
                    raise PeerGone(right, "connection closed")


@dataclass(frozen=True)
class InnerRing:
    """A ring inside a larger round (the host leaders of a hierarchical one): ``ranks``,
    the round rank of each ring position, to name members in ``PeerGone`` and
    ``Mismatch``; ``verdict(rank)``, whether a member whose connection failed had closed
    on purpose (``PeerGone.orderly``)."""

    ranks: tuple[int, ...]
    verdict: Callable[[int], bool | None]


class TcpRing(Transport):
    """The ring transport of rank ``rank`` of ``size`` over ``left`` (receive, from rank
    r-1) and ``right`` (send, to rank r+1), both non-blocking. ``settings.chunk_bytes``
    is the pipelining unit; ``settings.socket_buffer_bytes`` sets both sockets'
    SO_SNDBUF/SO_RCVBUF (None leaves them to the kernel's autotuning). The sockets stay
    the caller's: ``close`` leaves them open.

    A ring inside a larger round (the host leaders of a hierarchical one) gives
    ``inner`` (an ``InnerRing``)."""

    name = "tcp"

    def __init__(
        self,
        rank: int,
        size: int,
        left: socket.socket,
        right: socket.socket,
        settings: CommSettings,
        check: Check,
        *,
        inner: InnerRing | None = None,
    ):
        self.rank = rank
        self.size = size
        self.left_rank = (rank - 1) % size
        self.right_rank = (rank + 1) % size
        self._names = inner.ranks if inner is not None else tuple(range(size))
        self._verdict = inner.verdict if inner is not None else None
        self._left = left
        self._right = right
        self._chunk_bytes = settings.chunk_bytes
        self._check = check
        self._poller = select.poll()
        if settings.socket_buffer_bytes:
            for sock in (left, right):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, settings.socket_buffer_bytes)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, settings.socket_buffer_bytes)

    def _pump(self, sendq: deque, recvq: deque, deadline: float | None = None) -> None:
        try:
            pump(
                self._right,
                self._left,
                sendq,
                recvq,
                self._check,
                self._names[self.right_rank],
                self._names[self.left_rank],
                self._poller,
                deadline,
            )
        except PeerGone as e:
            if self._verdict is None:
                raise
            raise PeerGone(e.rank, e.detail, self._verdict(e.rank)) from None

    def _expect_header(self, mine: wire.OpHeader, recvq: deque) -> None:
        """Queue the left neighbour's header, to be checked against ``mine``."""
        buf = bytearray(wire.OP_HEADER_SIZE)
        recvq.append([memoryview(buf), partial(self._check_header, mine, buf)])

    def _check_header(self, mine: wire.OpHeader, buf: bytearray) -> None:
        try:
            theirs = wire.OpHeader.decode(bytes(buf))
        except wire.WireError as e:
            left = self._names[self.left_rank]
            raise Mismatch(f"rank {left} sent bytes out of step ({e})") from None
        why = wire.header_mismatch(mine, theirs)
        if why:
            raise Mismatch(f"with rank {self._names[self.left_rank]}: {why}")

    def exchange(
        self, mine: bytes, hdr: wire.OpHeader, deadline: float | None = None
    ) -> list[bytes]:
        """Every member's small byte string in rank order (a ring allgather of n-1 hops;
        also a barrier)."""
        n, r = self.size, self.rank
        blobs: list[bytes] = [b""] * n
        blobs[r] = mine
        lenlen = wire.META_LEN_SIZE
        sendq = deque([memoryview(hdr.encode() + len(mine).to_bytes(lenlen, "big") + mine)])
        recvq: deque = deque()
        self._expect_header(hdr, recvq)

        def want(step: int) -> None:
            lenbuf = bytearray(lenlen)
            recvq.append([memoryview(lenbuf), partial(got_len, step, lenbuf)])

        def got_len(step: int, lenbuf: bytearray) -> None:
            body = bytearray(int.from_bytes(lenbuf, "big"))
            if body:
                recvq.append([memoryview(body), partial(got_body, step, lenbuf, body)])
            else:
                got_body(step, lenbuf, body)

        def got_body(step: int, lenbuf: bytearray, body: bytearray) -> None:
            blobs[(r - step - 1) % n] = bytes(body)
            if step < n - 2:
                sendq.append(memoryview(bytes(lenbuf) + bytes(body)))
                want(step + 1)

        want(0)
        self._pump(sendq, recvq, deadline)
        return blobs

    def allreduce(self, x: np.ndarray, out: np.ndarray, op: str, hdr: wire.OpHeader) -> None:
        n, r = self.size, self.rank
        item = x.dtype.itemsize
        fn = layout.reducer(op)
        # No copy of x into out first: every segment of out is written exactly once,
        # by the reduce-scatter (x's part + what arrives) or by the allgather.
        outb = out.view(np.uint8)
        xb = x.view(np.uint8)
        segs = layout.ring_segments(x.size, n)
        sub = layout.elems_per_chunk(self._chunk_bytes, item)
        biggest = max(b - a for a, b in segs)
        tmp = np.empty(min(sub, biggest), dtype=x.dtype)
        tmpb = tmp.view(np.uint8)

        def view(a: int, b: int) -> memoryview:
            return outb[a * item : b * item].data

        sendq: deque = deque([memoryview(hdr.encode())])
        recvq: deque = deque()
        self._expect_header(hdr, recvq)
        for a, b in layout.chunk_ranges(*segs[r], sub):
            sendq.append(xb[a * item : b * item].data)

        def reduced(a: int, b: int, last: bool) -> None:
            part = out[a:b]
            fn(x[a:b], tmp[: b - a], out=part)
            if last and op == "average":
                layout.finish_average(part, n)
            # Step s+1 of the reduce-scatter (or step 0 of the allgather) sends this.
            sendq.append(view(a, b))

        # Reduce-scatter: at step s receive segment r-s-1 and fold it in.
        for s in range(n - 1):
            for a, b in layout.chunk_ranges(*segs[(r - s - 1) % n], sub):
                recvq.append([tmpb[: (b - a) * item].data, partial(reduced, a, b, s == n - 2)])
        # Allgather: at step s receive the finished segment r-s in place and pass it on.
        for s in range(n - 1):
            forward = s < n - 2
            for a, b in layout.chunk_ranges(*segs[(r - s) % n], sub):
                v = view(a, b)
                recvq.append([v, partial(sendq.append, v) if forward else None])
        self._pump(sendq, recvq)

    def broadcast(self, x: np.ndarray | None, root: int, hdr: wire.OpHeader) -> np.ndarray:
        # Every rank, the root included, sends its own header to the right and checks
        # its left neighbour's, so a rank that runs something else is caught by both of
        # its neighbours. The root's meta and data then flow round the ring.
        forward = self.right_rank != root
        chunk = self._chunk_bytes
        sendq: deque = deque([memoryview(hdr.encode())])
        recvq: deque = deque()
        self._expect_header(hdr, recvq)
        if self.rank == root:
            assert x is not None
            out = x.copy()
            sendq.append(memoryview(wire.encode_array_meta(out.dtype, out.shape)))
            ob = out.reshape(-1).view(np.uint8)
            for a, b in layout.chunk_ranges(0, ob.size, chunk):
                sendq.append(ob[a:b].data)
            self._pump(sendq, recvq)
            return out
        state: dict[str, Any] = {}
        lenbuf = bytearray(wire.META_LEN_SIZE)

        def got_len() -> None:
            body = bytearray(wire.decode_meta_len(bytes(lenbuf)))
            recvq.append([memoryview(body), partial(got_meta, body)])

        def got_meta(body: bytearray) -> None:
            try:
                dtype, shape = wire.decode_array_meta_body(bytes(body))
            except wire.WireError as e:
                left = self._names[self.left_rank]
                raise Mismatch(f"bad broadcast meta from rank {left}: {e}") from None
            out = np.empty(shape, dtype=dtype)
            state["out"] = out
            if forward:
                sendq.append(memoryview(bytes(lenbuf) + bytes(body)))
            ob = out.reshape(-1).view(np.uint8)
            for a, b in layout.chunk_ranges(0, ob.size, chunk):
                v = ob[a:b].data
                recvq.append([v, partial(sendq.append, v) if forward else None])

        recvq.append([memoryview(lenbuf), got_len])
        self._pump(sendq, recvq)
        return state["out"]

    def allgather(self, x: np.ndarray, hdr: wire.OpHeader) -> tuple[np.ndarray, list[int]]:
        n, r = self.size, self.rank
        meta = wire.encode_array_meta(x.dtype, x.shape)[wire.META_LEN_SIZE :]
        bodies = self.exchange(meta, hdr)
        metas = []
        for j, body in enumerate(bodies):
            try:
                metas.append(wire.decode_array_meta_body(body))
            except wire.WireError as e:
                raise Mismatch(f"bad allgather meta from rank {self._names[j]}: {e}") from None
        dtype, shape, offsets = gather_layout(metas)
        out = np.empty(shape, dtype=dtype)
        ob = out.reshape(-1).view(np.uint8)
        ob[offsets[r] : offsets[r + 1]] = x.reshape(-1).view(np.uint8)
        chunk = self._chunk_bytes
        sendq: deque = deque(
            ob[a:b].data for a, b in layout.chunk_ranges(offsets[r], offsets[r + 1], chunk)
        )
        recvq: deque = deque()
        for s in range(n - 1):
            src = (r - s - 1) % n
            forward = s < n - 2
            for a, b in layout.chunk_ranges(offsets[src], offsets[src + 1], chunk):
                v = ob[a:b].data
                recvq.append([v, partial(sendq.append, v) if forward else None])
        self._pump(sendq, recvq)
        return out, [m[1][0] for m in metas]

    def barrier(self, hdr: wire.OpHeader) -> None:
        self.exchange(b"", hdr)

    def abort(self, orderly: bool) -> None:
        """Shut both connections down: a pump blocked on them wakes at once."""
        for sock in (self._left, self._right):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Nothing to release: the sockets belong to whoever made them."""


__all__ = ["TcpRing", "pump", "RecvItem"]
