"""``HostGroup``: shared memory among the members of one host in a hierarchical round,
and the steps of a collective that go through the host's leader.

The members of a host are a ``ShmGroup`` (``shm.py``) of their own, named by their round
ranks in errors; the first of them is the host's leader, which alone talks to the
other hosts (``hier.py``). Besides the ``ShmGroup`` collectives it offers:

* ``allreduce_via_leader``: the host's sum (or max, min) reaches the leader, the leader
  combines it with the other hosts' (``across``), and every member copies the result
  back, piece by piece (``layout.pieces``; a leader alone on its host cuts alike). Per
  piece, three barriers: inputs in; each member reduces its slice (the leader straight
  into its output) and the leader gathers them; the leader's final piece out. The
  reduction work is shared by every member, as in ``ShmGroup.allreduce``; only the
  leader copies the host's sum out, and only it waits on the network.
* ``share`` / ``receive``: the leader's array to every member of the host, without the
  copy ``broadcast`` makes for its root.

Slot discipline is ``shm.py``'s: what is written before barrier k goes to slot k % 2.
Inputs are written before barrier k1 (slot k1 % 2), the reduced slices between k1 and k2
(slot k2 % 2, read by the leader before k3), the leader's result between k2 and k3
(slot k3 % 2 = k1 % 2, whose inputs everyone finished reading before k2), and the next
piece's inputs go to slot k2 % 2 again, which only the leader read, before it arrived
at k3.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import layout, wire
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
    ) -> None:
        """Reduce the members' flat ``x`` with ``op`` into flat ``out``, the leader calling
        ``across(piece)`` on each piece of the host's result (in place) before the
        members copy it. Raises ``Interrupted``, ``Mismatch`` or ``PeerGone``, and what
        ``across`` raises."""
        n, r = self.size, self.rank
        fn = layout.reducer(op)
        dtype = x.dtype
        first = True
        for start, end in layout.pieces(x.size, self.piece_bytes, dtype.itemsize):
            plen = end - start
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
                dst = (
                    out[start + a : start + b]
                    if r == 0
                    else self._slots[r][1 - s_in].view(dtype)[a:b]
                )
                others = [self._slots[j][s_in].view(dtype)[a:b] for j in range(n) if j != r]
                fn(x[start + a : start + b], others[0], out=dst)
                for o in others[1:]:
                    fn(dst, o, out=dst)
            self.k += 1
            self._arrive(self.k)
            piece = out[start : start + plen]
            if r == 0:
                s_red = self.k % 2
                for j in range(1, n):
                    aj, bj = segs[j]
                    if bj > aj:
                        out[start + aj : start + bj] = self._slots[j][s_red].view(dtype)[aj:bj]
                across(piece)
                self._slots[0][(self.k + 1) % 2].view(dtype)[:plen] = piece
            self.k += 1
            self._arrive(self.k)
            if r != 0:
                piece[:] = self._slots[0][self.k % 2].view(dtype)[:plen]

    def share(self, arr: np.ndarray, hdr: wire.OpHeader) -> None:
        """The leader's part of ``receive``: every member gets a copy of ``arr``."""
        meta = wire.encode_array_meta(arr.dtype, arr.shape)
        self._broadcast_bytes(arr.reshape(-1).view(np.uint8), hdr, meta, 0)

    def receive(self, hdr: wire.OpHeader) -> np.ndarray:
        """A member's part of ``share``: the leader's array."""
        return self.broadcast(None, 0, hdr)
