"""``HostGroup``: shared memory among the members of one host in a hierarchical round,
and the steps of a collective that go through the host's leader.

The members of a host are a ``ShmGroup`` (``shm.py``) of their own, named by their round
ranks in errors; the first of them is the host's leader, which alone talks to the
other hosts (``hier.py``). Besides the ``ShmGroup`` collectives it offers:

* ``allreduce_via_leader``: the other members reduce the host's inputs into the
  leader's slot, the leader combines that with the other hosts' there (``across``), and
  every member copies the result out, piece by piece (``layout.pieces``; a leader alone
  on its host cuts alike). The leader's network step on piece p starts as soon as p is
  reduced and runs (on a thread of its own, ``overlap.py``) while the host copies
  piece p - 1 out and piece p + 1 in and reduces it, so the link between hosts stays
  busy and the shared-memory steps cost no time on a host that waits on the network.
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
p's slot, which nobody else writes meanwhile.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np

from . import layout, wire
from .overlap import Overlap
from .shm import ShmGroup, ShmSegment
from .transport import Check


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
        overlap: Overlap | None = None,
    ) -> None:
        """Reduce the members' flat ``x`` with ``op`` into flat ``out``, the leader calling
        ``across(piece)`` on each piece of the host's result (in place, in shared memory)
        before the members copy it out; on ``overlap``'s thread when given (the leader's
        owner closes it before unmapping: a job may outlive an error here). Raises
        ``Interrupted``, ``Mismatch`` or ``PeerGone``, and what ``across`` raises."""
        n, r = self.size, self.rank
        fn = layout.reducer(op)
        dtype = x.dtype
        pieces = layout.pieces(x.size, self.piece_bytes, dtype.itemsize)
        base = self.k + 1  # piece p lives in slot (base + p) % 2 of every segment

        def slot(j: int, p: int) -> np.ndarray:
            return self._slots[j][(base + p) % 2].view(dtype)

        def result(p: int) -> np.ndarray:
            return slot(0, p)[: pieces[p][1] - pieces[p][0]]

        def start_across(p: int) -> None:
            if overlap is None:
                across(result(p))
            else:
                overlap.start(partial(across, result(p)))

        def finish_across() -> None:
            if overlap is not None:
                overlap.wait(self._check)

        for p, (start, end) in enumerate(pieces):
            plen = end - start
            a, b = layout.ring_segments(plen, n - 1)[r - 1] if r else (0, 0)
            if r == 0:
                slot(0, p)[:plen] = x[start:end]
            elif n > 2:  # the other reducers need every segment but mine
                slot(r, p)[:a] = x[start : start + a]
                slot(r, p)[b:plen] = x[start + b : end]
            if p == 0:
                self.write_desc(base % 2, hdr)
            self._step()  # A(p): the inputs of piece p are in
            if p == 0:
                self._check_headers(base % 2, hdr)
            if r == 0:
                if p > 0:
                    finish_across()  # piece p - 1, started after X(p - 1)
            elif b > a:
                # In place in the leader's slot: only this member reads this segment.
                dst = slot(0, p)[a:b]
                fn(x[start + a : start + b], dst, out=dst)
                for j in range(1, n):
                    if j != r:
                        fn(dst, slot(j, p)[a:b], out=dst)
            self._step()  # X(p): piece p reduced, piece p - 1 final
            if r == 0:
                # Runs while this host copies piece p - 1 out and piece p + 1 in: the
                # other slot, so never the bytes the network step reads and writes.
                start_across(p)
            if p > 0:
                out[pieces[p - 1][0] : pieces[p - 1][1]] = result(p - 1)
                self._step()  # Y(p - 1): piece p - 1 copied out everywhere
        if r == 0:
            finish_across()
        self._step()  # Z: the last piece final
        out[pieces[-1][0] : pieces[-1][1]] = result(len(pieces) - 1)

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
