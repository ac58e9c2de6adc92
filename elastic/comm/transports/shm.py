"""Same-host data path: every rank owns one shared-memory segment that all ranks map.

Why: on one host the TCP ring moves each byte through the kernel twice per hop (send
copy, receive copy) plus syscalls; here a byte is copied into shared memory once,
reduced once by the rank that owns its slice, and copied out once.

Segment of rank r (an anonymous ``memfd``; peers open it through
``/proc/<pid>/fd/<fd>``, so nothing is left behind in /dev/shm when a process is
SIGKILLed; a random token in the header proves a peer mapped the right file):

    [0, 8)        progress counter (int64): the number of barriers r has arrived at.
                  Its low 32 bits are the futex word waiters sleep on.
    [8, 12)       closed flag (int32): 0 open, CLOSED_ORDERLY, CLOSED_ABORT
    [64, 80)      token
    [1024, 3072)  two descriptor slots (op header + array meta) of 1 KiB
    [4096, ...)   two data slots of ``piece_bytes``

Barrier k: a rank stores k in its counter, wakes sleepers, and waits until every
counter is >= k. Buffers alternate by barrier parity: what is written before barrier k
goes to slot k % 2 and is read between barriers k and k+1; nobody writes slot k % 2
again before barrier k+1 proves every reader is done. Large arrays stream through the
two slots in pieces, so the segment stays small and the working set stays in cache.

Memory ordering: data is written by numpy (memcpy/ufunc loops; glibc fences its
non-temporal stores), then the counter by a separate Python statement, then a futex
syscall. x86-64 keeps stores in order (TSO), so a reader that sees the counter sees the
data. Other architectures would need explicit fences, so ``shm_supported()`` is False
there and the TCP ring is used.

Waiting: spin briefly (cheap when every rank has its own CPU), then sleep in
``futex(FUTEX_WAIT)`` with a short timeout. Measured on this 2-core VM, a futex wake
costs about 22-28 us per barrier for 2-4 ranks against 18-72 us for a byte over a TCP
mesh, and it needs one syscall whatever the world size. A failure is never waited out
here: the communicator aborts the group (every futex woken, this rank's segment marked
closed) when it breaks, and every wait re-checks it.

``ShmGroup`` is the ``Transport`` over these segments; the communicator decides whether
all members can use it (``selection.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import platform
import secrets
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from elastic.comm import layout, wire
from elastic.comm.transports.base import Check, Mismatch, PeerGone, Transport, gather_layout

HEADER_BYTES = 4096
_COUNTER_OFF = 0
_CLOSED_OFF = 8
_TOKEN_OFF = 64
_DESC_OFF = 1024
_DESC_BYTES = 1024

CLOSED_ORDERLY = 1
CLOSED_ABORT = 2

_INFO = struct.Struct("!IIQ16s")  # pid, fd, size, token


def shm_supported() -> bool:
    """True where this module's memory-ordering and futex assumptions hold
    (Linux on x86-64 with memfd_create)."""
    return (
        sys.platform.startswith("linux")
        and platform.machine() in ("x86_64", "AMD64")
        and hasattr(os, "memfd_create")
        and _futex is not None
    )


# --- futex via the raw syscall (x86-64 number) ---------------------------------------


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_futex: Any
try:
    _libc = ctypes.CDLL(None, use_errno=True)  # CDLL releases the GIL around calls
    _futex = _libc.syscall
    _futex.restype = ctypes.c_long
except (OSError, AttributeError):  # pragma: no cover - non-glibc platforms
    _futex = None

_SYS_FUTEX = 202
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_INT_MAX = 0x7FFFFFFF


def _as_c_int(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


def futex_wait(addr: int, expected: int, timeout: float) -> None:
    """Sleep while the 32-bit word at ``addr`` equals ``expected`` (at most ``timeout`` s)."""
    sec = int(timeout)
    ts = _Timespec(sec, int((timeout - sec) * 1e9))
    _futex(
        _SYS_FUTEX,
        ctypes.c_void_p(addr),
        _FUTEX_WAIT,
        ctypes.c_int(_as_c_int(expected)),
        ctypes.byref(ts),
        None,
        0,
    )


def futex_wake(addr: int) -> None:
    _futex(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAKE, ctypes.c_int(_INT_MAX), None, None, 0)


def default_spin_us(busy_threads: int, cpus: int) -> float:
    """Spin only when each of the ``busy_threads`` a collective keeps running on this
    host can have one of its ``cpus``: with more threads than CPUs a spinning waiter
    steals the time slice the thread it waits for needs."""
    return 50.0 if busy_threads <= cpus else 0.0


class ShmSegment:
    """This rank's own segment (created before the group exists)."""

    def __init__(self, piece_bytes: int):
        self.piece_bytes = piece_bytes
        self.size = HEADER_BYTES + 2 * piece_bytes
        self.token = secrets.token_bytes(16)
        self.fd = os.memfd_create("elastic-ring", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.size)
            self.mm = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        # Touch every page now so the first collective does not pay the page faults.
        np.frombuffer(self.mm, dtype=np.uint8)[:] = 0
        self.mm[_TOKEN_OFF : _TOKEN_OFF + 16] = self.token

    def info(self) -> bytes:
        return _INFO.pack(os.getpid(), self.fd, self.size, self.token)

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _map_peer(info: bytes, piece_bytes: int) -> mmap.mmap:
    """Map a peer's segment. Raises OSError when it cannot be opened or is not the
    segment the peer announced (wrong size or token)."""
    if len(info) != _INFO.size:
        raise OSError("not a segment description")
    pid, fd, size, token = _INFO.unpack(info)
    if size != HEADER_BYTES + 2 * piece_bytes:
        raise OSError("segment size differs (shm_piece_bytes must match on every rank)")
    pfd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    try:
        mm = mmap.mmap(pfd, size)
    finally:
        os.close(pfd)
    if mm[_TOKEN_OFF : _TOKEN_OFF + 16] != token:
        mm.close()
        raise OSError("segment token differs")
    return mm


class ShmGroup(Transport):
    """All ranks' segments mapped in this process, and the collectives over them.

    ``infos`` are every rank's ``ShmSegment.info()``; ``check()`` raises ``Interrupted``
    when the owning communicator broke; ``spin_us`` is how long a wait spins before
    sleeping. A rank that marked its segment closed raises ``PeerGone`` in the ranks
    waiting for it (``orderly`` when it closed on purpose). ``ranks`` names the members
    in errors when they are part of a larger round (default: their index).

    Raises:
        OSError: a peer's segment cannot be mapped, or is not the one it announced.
    """

    name = "shm"

    def __init__(
        self,
        rank: int,
        size: int,
        own: ShmSegment,
        infos: list[bytes],
        spin_us: float,
        check: Check,
        *,
        ranks: Sequence[int] | None = None,
    ):
        self.rank = rank
        self.size = size
        self._names = tuple(ranks) if ranks is not None else tuple(range(size))
        self.piece_bytes = own.piece_bytes
        self.spin_s = spin_us / 1e6
        self._check = check
        self._own = own
        self._mms: list[mmap.mmap] = []  # every rank's segment, in rank order
        try:
            for j in range(size):
                self._mms.append(own.mm if j == rank else _map_peer(infos[j], own.piece_bytes))
        except BaseException:
            self._unmap()
            raise
        self._views()
        self.k = 0  # barriers completed; identical on every rank

    def _views(self) -> None:
        self._bytes = [np.frombuffer(mm, dtype=np.uint8) for mm in self._mms]
        self._counters = [b[_COUNTER_OFF : _COUNTER_OFF + 8].view(np.int64) for b in self._bytes]
        self._closed = [b[_CLOSED_OFF : _CLOSED_OFF + 4].view(np.int32) for b in self._bytes]
        self._addrs = [c.ctypes.data for c in self._counters]
        pb = self.piece_bytes
        self._slots = [
            [b[HEADER_BYTES + s * pb : HEADER_BYTES + (s + 1) * pb] for s in (0, 1)]
            for b in self._bytes
        ]

    def _unmap(self) -> None:
        self._bytes, self._counters, self._closed, self._slots, self._addrs = [], [], [], [], []
        for j, mm in enumerate(self._mms):
            if j != self.rank:
                # A view that escaped keeps the mapping alive: leave it to the GC.
                with contextlib.suppress(BufferError):
                    mm.close()
        self._mms = []
        with contextlib.suppress(BufferError):
            self._own.mm.close()

    def close(self) -> None:
        """Unmap everything. The caller guarantees no collective is running."""
        if self._mms:
            self._unmap()

    # --- signalling ---------------------------------------------------------------

    def abort(self, orderly: bool) -> None:
        """Tell ranks waiting on this one that it will not arrive, and wake this
        process's own sleepers (the communicator broke)."""
        if self._closed:  # still mapped
            self._closed[self.rank][0] = CLOSED_ORDERLY if orderly else CLOSED_ABORT
        for a in self._addrs:
            futex_wake(a)

    def _arrive(self, k: int) -> None:
        """Arrive at barrier ``k`` and wait until every rank has.

        Raises ``Interrupted`` (from ``check``) or ``PeerGone``."""
        self._counters[self.rank][0] = k
        futex_wake(self._addrs[self.rank])
        for j in range(self.size):
            if j != self.rank:
                self._wait(j, k)

    def _wait(self, j: int, k: int) -> None:
        c = self._counters[j]
        if c[0] >= k:
            return
        if self.spin_s:
            end = time.perf_counter() + self.spin_s
            while c[0] < k and time.perf_counter() < end:
                pass
        closed = self._closed[j]
        addr = self._addrs[j]
        while True:
            v = int(c[0])
            if v >= k:
                return
            self._check()
            if closed[0]:
                raise PeerGone(
                    self._names[j],
                    "stopped taking part in the collective",
                    orderly=int(closed[0]) == CLOSED_ORDERLY,
                )
            futex_wait(addr, v, 0.05)

    # --- descriptors ----------------------------------------------------------------

    def write_desc(self, slot: int, hdr: wire.OpHeader, meta: bytes = b"") -> None:
        blob = hdr.encode() + meta
        if len(blob) > _DESC_BYTES:
            raise ValueError("array has too many dimensions for the shared-memory header")
        off = _DESC_OFF + slot * _DESC_BYTES
        self._bytes[self.rank][off : off + len(blob)] = np.frombuffer(blob, dtype=np.uint8)

    def read_header(self, j: int, slot: int) -> wire.OpHeader:
        off = _DESC_OFF + slot * _DESC_BYTES
        return wire.OpHeader.decode(self._bytes[j][off : off + wire.OP_HEADER_SIZE].tobytes())

    def read_meta(self, j: int, slot: int) -> tuple[np.dtype, tuple[int, ...]]:
        off = _DESC_OFF + slot * _DESC_BYTES + wire.OP_HEADER_SIZE
        b = self._bytes[j]
        n = wire.decode_meta_len(b[off : off + wire.META_LEN_SIZE].tobytes())
        if n > _DESC_BYTES:
            raise wire.WireError("bad meta length")
        body = b[off + wire.META_LEN_SIZE : off + wire.META_LEN_SIZE + n].tobytes()
        return wire.decode_array_meta_body(body)

    def _check_headers(self, slot: int, mine: wire.OpHeader) -> None:
        """Raises ``Mismatch`` when a rank's header in ``slot`` differs from ``mine``."""
        for j in range(self.size):
            if j != self.rank:
                why = wire.header_mismatch(mine, self.read_header(j, slot))
                if why:
                    raise Mismatch(f"rank {self._names[j]}: {why}")

    # --- collectives (the caller validated arguments and owns the op lock) ----------

    def allreduce(self, x: np.ndarray, out: np.ndarray, op: str, hdr: wire.OpHeader) -> None:
        """See ``Transport.allreduce``."""
        n, r = self.size, self.rank
        fn = layout.reducer(op)
        dtype = x.dtype
        per_piece = max(1, self.piece_bytes // dtype.itemsize)
        total = x.size
        start = 0
        first = True
        while first or start < total:
            plen = min(per_piece, total - start)
            segs = layout.ring_segments(plen, n)
            a, b = segs[r]
            self.k += 1
            s_in = self.k % 2
            mine = self._slots[r][s_in].view(dtype)
            # Peers need every slice but mine; my own slice is read straight from x.
            mine[:a] = x[start : start + a]
            mine[b:plen] = x[start + b : start + plen]
            if first:
                self.write_desc(s_in, hdr)
            self._arrive(self.k)
            if first:
                self._check_headers(s_in, hdr)
                first = False
            if b > a:
                dst = self._slots[r][1 - s_in].view(dtype)[a:b]
                others = [self._slots[j][s_in].view(dtype)[a:b] for j in range(n) if j != r]
                fn(x[start + a : start + b], others[0], out=dst)
                for o in others[1:]:
                    fn(dst, o, out=dst)
                if op == "average":
                    layout.finish_average(dst, n)
            self.k += 1
            self._arrive(self.k)
            s_out = self.k % 2
            for j, (aj, bj) in enumerate(segs):
                if bj > aj:
                    out[start + aj : start + bj] = self._slots[j][s_out].view(dtype)[aj:bj]
            start += plen

    def broadcast(self, x: np.ndarray | None, root: int, hdr: wire.OpHeader) -> np.ndarray:
        """See ``Transport.broadcast``."""
        if self.rank == root:
            assert x is not None
            self._broadcast_bytes(
                x.reshape(-1).view(np.uint8), hdr, wire.encode_array_meta(x.dtype, x.shape), root
            )
            return x.copy()
        out = self._broadcast_bytes(np.empty(0, dtype=np.uint8), hdr, b"", root)
        assert out is not None
        return out

    def _broadcast_bytes(
        self, data: np.ndarray, hdr: wire.OpHeader, meta: bytes, root: int
    ) -> np.ndarray | None:
        """The root passes its flat uint8 ``data`` and meta (and gets None); the others
        pass nothing and get the root's array."""
        r = self.rank
        pb = self.piece_bytes
        out = None
        total = data.size
        start = 0
        first = True
        while first or start < total:
            self.k += 1
            s = self.k % 2
            if r == root:
                plen = min(pb, total - start)
                self._slots[r][s][:plen] = data[start : start + plen]
            if first:
                # Everyone writes a header (only the root's carries meta) so every
                # rank can check that all run this broadcast.
                self.write_desc(s, hdr, meta if r == root else b"")
            self._arrive(self.k)
            if first:
                self._check_headers(s, hdr)
                if r != root:
                    dtype, shape = self.read_meta(root, s)
                    out = np.empty(shape, dtype=dtype)
                    total = out.nbytes
                first = False
            plen = min(pb, total - start)
            if out is not None and plen > 0:
                out.reshape(-1).view(np.uint8)[start : start + plen] = self._slots[root][s][:plen]
            start += plen
        return out

    def allgather(self, x: np.ndarray, hdr: wire.OpHeader) -> tuple[np.ndarray, list[int]]:
        """See ``Transport.allgather``."""
        meta = wire.encode_array_meta(x.dtype, x.shape)
        metas, buf = self._allgather_bytes(x.reshape(-1).view(np.uint8), hdr, meta)
        dtype, shape, _ = gather_layout(metas)
        return buf.view(dtype).reshape(shape), [m[1][0] for m in metas]

    def _allgather_bytes(self, data: np.ndarray, hdr: wire.OpHeader, meta: bytes):
        """Every rank's flat uint8 ``data`` and meta: ``(list of (dtype, shape), np.uint8
        buffer with the blocks in rank order)``."""
        n, r = self.size, self.rank
        pb = self.piece_bytes
        p = 0
        npieces = 1
        # Set from the descriptors once the first piece is in.
        metas: list[tuple[np.dtype, tuple[int, ...]]] = []
        sizes: list[int] = []
        offsets = np.zeros(1, dtype=np.int64)
        buf = np.empty(0, dtype=np.uint8)
        while p < npieces:
            self.k += 1
            s = self.k % 2
            lo = p * pb
            mine_len = max(0, min(pb, data.size - lo))
            if mine_len:
                self._slots[r][s][:mine_len] = data[lo : lo + mine_len]
            if p == 0:
                self.write_desc(s, hdr, meta)
            self._arrive(self.k)
            if p == 0:
                self._check_headers(s, hdr)
                metas = [self.read_meta(j, s) for j in range(n)]
                sizes = [int(np.prod(sh, dtype=np.int64)) * dt.itemsize for dt, sh in metas]
                offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
                buf = np.empty(int(offsets[-1]), dtype=np.uint8)
                npieces = max(1, max(-(-sz // pb) for sz in sizes))
            for j in range(n):
                ln = max(0, min(pb, sizes[j] - lo))
                if ln:
                    o = int(offsets[j]) + lo
                    buf[o : o + ln] = self._slots[j][s][:ln]
            p += 1
        return metas, buf

    def barrier(self, hdr: wire.OpHeader) -> None:
        """See ``Transport.barrier``."""
        self.k += 1
        s = self.k % 2
        self.write_desc(s, hdr)
        self._arrive(self.k)
        self._check_headers(s, hdr)
