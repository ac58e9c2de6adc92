"""``HostGroup``: shared memory among the members of one host in a hierarchical round,
and the steps of a collective that go through the host's leader.

The members of a host are a ``ShmGroup`` (``shm.py``) of their own, named by their round
ranks in errors; the first of them is the host's leader, which alone talks to the
other hosts (``hier.py``). Besides the ``ShmGroup`` collectives it offers:

* ``allreduce_via_leader``: the other members reduce the host's inputs into the
  leader's slot, the leader combines that with the other hosts' there (``across``), and
  every member copies the result out, piece by piece (``layout.pieces``; a leader alone
  on its host cuts alike). Given a thread of its own (``overlap.py``; the transport
  gives one when the host has a CPU to spare), the leader's network step on piece p
  starts as soon as p is reduced and runs while the host copies piece p - 1 out and
  piece p + 1 in and reduces it, so the link between hosts stays busy and the
  shared-memory steps cost no time on a host that waits on the network. Without one,
  the leader's step on piece p - 1 runs while the others reduce piece p.
* ``share`` / ``receive``: the leader's array to every member of the host, without the
  copy ``broadcast`` makes for its root.

Per piece p, three barriers: A(p) once its inputs are in (the leader's whole piece, and
what each other member's fellow reducers need of its own), X(p) once it is reduced (and
the previous piece is final: the leader waited for its ``across`` first), Y(p - 1) once
the previous piece is copied out everywhere; a last barrier Z once the last piece is
final. Piece p lives in slot (k + 1 + p) % 2, k being the barrier count before the call:
shm.py's rule (what is written before barrier k goes to slot k % 2) holds at both ends,
since the first writes precede barrier k + 1 and the last piece sits in slot Z % 2 while
it is copied out. In between, a slot is written again only for the piece after next:
after Y of the piece it held, and the reducers' inputs in it were read before X. The
network step on piece p runs from X(p) to just before X(p + 1): it touches only piece
p's slot, which nobody else writes meanwhile. A leader with a network thread lets that
thread arrive at the X barriers itself (``_lead``), so the link goes from one piece to
the next without a wake-up of the leader's main thread in between.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np

from elastic.comm import layout, wire
from elastic.comm.transports.base import Check
from elastic.comm.transports.overlap import Overlap
from elastic.comm.transports.shm import ShmGroup, ShmSegment, futex_wait, futex_wake


class HostGroup(ShmGroup):
    """The shared memory of ``members`` (round ranks in rank order; the first is the
    leader) as seen by member ``rank``; ``infos`` are their ``ShmSegment.info()`` in the
    same order.

    Raises:
        OSError: a member's segment cannot be mapped, or is not the one it announced.
    """

    def __init__(
        self,
        members: tuple[int, ...],
        rank: int,
        own: ShmSegment,
        infos: list[bytes],
        spin_us: float,
        check: Check,
    ):
        super().__init__(
            members.index(rank), len(members), own, infos, spin_us, check, ranks=members
        )
        self.members = members

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def allreduce_via_leader(
        self,
        x: np.ndarray,
        out: np.ndarray,
        op: str,
        hdr: wire.OpHeader,
        across: Callable[[np.ndarray], None],
        piece_bytes: int,
        overlap: Overlap | None = None,
    ) -> None:
        """Reduce the members' flat ``x`` with ``op`` into flat ``out`` in pieces of
        ``piece_bytes`` (at most a slot; every member cuts alike), the leader calling
        ``across(piece)`` on each piece of the host's result (in place, in shared memory)
        before the members copy it out; on ``overlap``'s thread when given (the leader's
        owner closes it before unmapping: that thread may outlive an error here). Raises
        ``Interrupted``, ``Mismatch`` or ``PeerGone``, and what ``across`` raises."""
        n, r = self.size, self.rank
        fn = layout.reducer(op)
        piece_bytes = min(piece_bytes, self.piece_bytes)
        pieces = layout.pieces(x.size, piece_bytes, x.dtype.itemsize)
        at = _Pieces(self, pieces, x.dtype)
        if r == 0 and overlap is not None:
            self._lead(x, out, hdr, at, partial(self._network, at, across), overlap)
            return
        for p, (start, end) in enumerate(pieces):
            plen = end - start
            a, b = layout.ring_segments(plen, n - 1)[r - 1] if r else (0, 0)
            if r == 0:
                at.slot(0, p)[:plen] = x[start:end]
            elif n > 2:  # the other reducers need every segment but mine
                at.slot(r, p)[:a] = x[start : start + a]
                at.slot(r, p)[b:plen] = x[start + b : end]
            if p == 0:
                self.write_desc(at.first_slot, hdr)
            self._step()  # A(p): the inputs of piece p are in
            if p == 0:
                self._check_headers(at.first_slot, hdr)
            if r == 0:
                if p > 0:
                    across(at.result(p - 1))
            elif b > a:
                # In place in the leader's slot: only this member reads this segment.
                dst = at.slot(0, p)[a:b]
                fn(x[start + a : start + b], dst, out=dst)
                for j in range(1, n):
                    if j != r:
                        fn(dst, at.slot(j, p)[a:b], out=dst)
            self._step()  # X(p): piece p reduced, piece p - 1 final
            if p > 0:
                at.copy_out(p - 1, out)
                self._step()  # Y(p - 1): piece p - 1 copied out everywhere
        if r == 0:
            across(at.result(len(pieces) - 1))
        self._step()  # Z: the last piece final
        at.copy_out(len(pieces) - 1, out)

    def _lead(
        self,
        x: np.ndarray,
        out: np.ndarray,
        hdr: wire.OpHeader,
        at: _Pieces,
        network: Callable[[], None],
        overlap: Overlap,
    ) -> None:
        """The leader's part of ``allreduce_via_leader`` with its network steps on
        ``overlap``'s thread (``_network``), which also arrives at every X barrier for
        this member, so that it goes from one piece to the next without waiting for this
        thread. The two threads take turns on this member's counter: this one arrives
        at A(p) and Y(p - 1), the other at X(p) once A(p) is in and its previous piece
        is final, and this one goes on once X(p) is passed."""
        for p, (start, end) in enumerate(at.pieces):
            at.slot(0, p)[: end - start] = x[start:end]
            if p == 0:
                self.write_desc(at.first_slot, hdr)
            self._arrive(at.barrier_a(p))
            if p == 0:
                self._check_headers(at.first_slot, hdr)
                overlap.start(network)
            self._passed(at.barrier_a(p) + 1, overlap)  # X(p)
            if p > 0:
                at.copy_out(p - 1, out)
                self._arrive(at.barrier_a(p) + 2)  # Y(p - 1)
        overlap.wait(self._check)  # the last network step
        self.k = at.barrier_z
        self._arrive(self.k)  # Z
        at.copy_out(len(at.pieces) - 1, out)

    def _network(self, at: _Pieces, across: Callable[[np.ndarray], None]) -> None:
        """The leader's second thread (see ``_lead``): for each piece, once this member
        arrived at A(p), arrive at X(p) and run ``across`` on the piece. Wakes the first
        thread when it fails."""
        try:
            for p in range(len(at.pieces)):
                if p > 0:
                    self._wait(self.rank, at.barrier_a(p))
                self._arrive(at.barrier_a(p) + 1)  # X(p): piece p reduced, p - 1 final
                across(at.result(p))
        finally:
            futex_wake(self._addrs[self.rank])

    def _passed(self, k: int, overlap: Overlap) -> None:
        """Wait until every member, this one's other thread included, is at barrier
        ``k``. Raises what that thread raised when it stopped before."""
        own = self._counters[self.rank]
        while own[0] < k:
            if not overlap.busy and own[0] < k:  # it ended without arriving
                overlap.wait(self._check)  # raises its error
                raise RuntimeError("the leader's network thread ended early")
            self._check()
            futex_wait(self._addrs[self.rank], int(own[0]), 0.05)
        for j in range(self.size):
            if j != self.rank:
                self._wait(j, k)

    def _step(self) -> None:
        self.k += 1
        self._arrive(self.k)

    def share(self, arr: np.ndarray, hdr: wire.OpHeader) -> None:
        """The leader's part of ``receive``: every member gets a copy of ``arr``."""
        meta = wire.encode_array_meta(arr.dtype, arr.shape)
        self._broadcast_bytes(arr.reshape(-1).view(np.uint8), hdr, meta, 0)

    def receive(self, hdr: wire.OpHeader) -> np.ndarray:
        """A member's part of ``share``: the leader's array."""
        return self.broadcast(None, 0, hdr)


class _Pieces:
    """Where the pieces of one ``allreduce_via_leader`` live in ``group``'s segments
    (piece p in slot (k + 1 + p) % 2, k being the barrier count before the call) and
    which barrier each step is: A(0) = k + 1, A(p) = k + 3p after; X(p) = A(p) + 1,
    Y(p - 1) = A(p) + 2; Z = k + 3 * (number of pieces)."""

    def __init__(self, group: HostGroup, pieces: list[tuple[int, int]], dtype: np.dtype):
        self.pieces = pieces
        self._slots = group._slots
        self._k = group.k
        self._dtype = dtype
        self.first_slot = (self._k + 1) % 2
        self.barrier_z = self._k + 3 * len(pieces)

    def slot(self, j: int, p: int) -> np.ndarray:
        return self._slots[j][(self._k + 1 + p) % 2].view(self._dtype)

    def result(self, p: int) -> np.ndarray:
        """Piece p in the leader's slot (the host's sum, then the round's)."""
        return self.slot(0, p)[: self.pieces[p][1] - self.pieces[p][0]]

    def copy_out(self, p: int, out: np.ndarray) -> None:
        out[self.pieces[p][0] : self.pieces[p][1]] = self.result(p)

    def barrier_a(self, p: int) -> int:
        return self._k + (3 * p if p else 1)
