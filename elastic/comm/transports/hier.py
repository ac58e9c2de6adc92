"""``HierTransport``: shared memory inside each host, a TCP ring among one leader per
host, for a round whose members share some hosts but not all.

Why: on a host, shared memory moves a byte with one copy in and one out where the TCP
ring would push it through the kernel twice per hop; between hosts only the leaders'
ring crosses the network, carrying each byte once per host instead of once per member.

The plan (``topology.Plan``) lists each host's members in rank order; the first is its
leader. Every collective is the same three steps on every host:

* allreduce: reduce inside the host to the leader (``HostGroup.allreduce_via_leader``,
  shared by every member), allreduce among the leaders (TCP ring, in place, on the
  leader's second thread while its host works on the neighbouring pieces, when the
  host has a CPU to spare for it: ``CommSettings.leader_overlap``), and the
  leader's result back to every member, piece by piece ("average" sums, and the leader
  divides by the round's size once);
* broadcast: on the root's host, shared-memory broadcast from the root; the root host's
  leader then broadcasts round the leaders' ring; on every other host its leader shares
  what it received;
* allgather: each host gathers its members' rows (shared memory); the leaders exchange
  every member's row count and then the hosts' blocks (TCP ring), put the rows in rank
  order and share the count and the result with their host;
* barrier: a host barrier, a barrier of the leaders, a host barrier.

Failures: the communicator's failure monitor still watches the ring of every member, so
a lost member anywhere breaks every survivor as fast as with the other transports; this
transport only has to wake up and name whom it found gone, by round rank. A member that
breaks marks its segment (orderly or not) for its host, as ``ShmGroup`` does; a leader
that breaks also sends its verdict (``wire.LEADER_CLOSED_*``) to the neighbouring
leaders on a connection beside each data connection, and shuts the data connections
down. A leader that sees a data connection fail reads that verdict, so an orderly close
of another host is reported as such (a crash sends none: the connection just ends).

Mismatches: each host compares its members' headers in shared memory, the leaders
compare theirs on the ring. Members of a host that agree among themselves can finish a
broadcast from a root on their host before their leader finds that another host runs
something else (as ranks after the root can in the TCP ring); their next call raises.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from elastic.comm import layout, wire
from elastic.comm.base import CommSettings
from elastic.comm.peers.links import Connect, NeighbourLinks
from elastic.comm.transports.base import Check, Mismatch, Transport
from elastic.comm.transports.host_group import HostGroup
from elastic.comm.transports.overlap import Overlap
from elastic.comm.transports.tcp_ring import InnerRing, TcpRing
from elastic.comm.transports.topology import Plan


class LeaderLinks:
    """A host leader's connections to the leaders before and after it in the ring
    (``leaders``, round ranks in ring order): a data connection to each, for the TCP
    ring, and a verdict connection beside each, that carries one byte when a leader
    breaks.

    Raises (when connecting): PeerLostError (a leader did not connect in time), and what
    ``dial``, ``claim`` and ``check`` raise.
    """

    def __init__(
        self,
        rank: int,
        leaders: Sequence[int],
        dial: Connect,
        claim: Connect,
        connect_timeout: float,
        check: Check,
    ):
        self.links = NeighbourLinks(
            rank,
            len(leaders),
            ring=leaders,
            channels=(wire.CHANNEL_LEADER_DATA, wire.CHANNEL_LEADER_CTRL),
        )
        try:
            self.data_left, self.data_right, verdict_left, verdict_right = self.links.connect(
                dial, claim, connect_timeout, check
            )
        except BaseException:
            self.links.close()
            raise
        self._verdicts = [(verdict_left, self.links.left), (verdict_right, self.links.right)]

    def verdict(self, rank: int, grace: float) -> bool | None:
        """Whether leader ``rank`` (a neighbour) closed on purpose: True when its verdict
        says so, False when it broke by a failure or its connection ended without one
        (it crashed), None when nothing came within ``grace`` seconds."""
        socks = [sock for sock, peer in self._verdicts if peer == rank]
        poller = select.poll()
        for sock in socks:
            poller.register(sock.fileno(), select.POLLIN)
        deadline = time.monotonic() + grace
        while True:
            for sock in socks:
                try:
                    got = sock.recv(1, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except OSError:
                    return False
                return got == wire.LEADER_CLOSED_ORDERLY
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not socks:
                return None
            poller.poll(remaining * 1000.0)

    def abort(self, orderly: bool) -> None:
        """Send this leader's verdict, then shut every connection down (never blocks)."""
        self.links.notify(wire.LEADER_CLOSED_ORDERLY if orderly else wire.LEADER_CLOSED_ABORT)
        self.links.shutdown()

    def close(self) -> None:
        self.links.close()


@dataclass(frozen=True)
class HierParts:
    """What one member's hierarchical transport is made of: ``host``, this host's shared
    memory (None when the member is alone on its host); ``leaders``, the leaders'
    connections (None unless this member is a leader and there are several hosts); and
    ``overlap``, whether a leader with a host runs its network steps on a thread of its
    own (``CommSettings.leader_overlap``)."""

    host: HostGroup | None
    leaders: LeaderLinks | None
    overlap: bool


class HierTransport(Transport):
    """The hierarchical transport of rank ``rank`` of a round of ``size`` under ``plan``,
    made of ``parts`` (see ``HierParts``); ``settings.close_grace`` bounds the wait for a
    failed leader's verdict. The transport owns ``parts.host`` and ``parts.leaders`` and
    releases them in ``close``."""

    name = "hier"

    def __init__(
        self,
        rank: int,
        size: int,
        plan: Plan,
        parts: HierParts,
        settings: CommSettings,
        check: Check,
    ):
        host, leaders = parts.host, parts.leaders
        self.rank = rank
        self.size = size
        self.plan = plan
        self.host_index = plan.group_of(rank)
        self.members = plan.groups[self.host_index]
        self.is_leader = self.members[0] == rank
        self.piece_bytes = layout.hier_piece_bytes(settings.shm_piece_bytes)
        self.host = host
        self.links = leaders
        self.ring: TcpRing | None = None
        # The leaders' network step on one piece runs beside the host's shared-memory
        # steps on the next (``HostGroup.allreduce_via_leader``), given a CPU for it.
        self.overlap: Overlap | None = None
        if leaders is not None:
            if host is not None and parts.overlap:
                self.overlap = Overlap(f"elastic-hier-{rank}")
            grace = settings.close_grace
            self.ring = TcpRing(
                self.host_index,
                len(plan.groups),
                leaders.data_left,
                leaders.data_right,
                settings,
                check,
                inner=InnerRing(
                    tuple(g[0] for g in plan.groups), lambda rank: leaders.verdict(rank, grace)
                ),
            )

    # --- the collectives (see the module docstring) ---------------------------------

    def allreduce(self, x: np.ndarray, out: np.ndarray, op: str, hdr: wire.OpHeader) -> None:
        inner = "sum" if op == "average" else op
        ring = self.ring

        def across(part: np.ndarray) -> None:
            if ring is not None:
                ring.allreduce(part, part, inner, hdr)  # in place: see TcpRing.allreduce
            if op == "average":
                layout.finish_average(part, self.size)

        if self.host is not None:
            self.host.allreduce_via_leader(
                x, out, inner, hdr, across, self.piece_bytes, self.overlap
            )
        elif ring is not None:
            # Piece by piece, as the leaders of hosts with shared memory go.
            for a, b in layout.pieces(x.size, self.piece_bytes, x.dtype.itemsize):
                ring.allreduce(x[a:b], out[a:b], inner, hdr)
                if op == "average":
                    layout.finish_average(out[a:b], self.size)
        else:  # pragma: no cover - a round of one never gets a transport
            np.copyto(out, x)

    def broadcast(self, x: np.ndarray | None, root: int, hdr: wire.OpHeader) -> np.ndarray:
        root_host = self.plan.group_of(root)
        host, ring = self.host, self.ring
        if root_host == self.host_index:
            if host is not None:
                arr = host.broadcast(x, self.members.index(root), hdr)
            else:
                assert x is not None  # alone on its host: this member is the root
                arr = x.copy()
            if ring is not None:
                ring.broadcast(arr, root_host, hdr)
            return arr
        if ring is not None:
            arr = ring.broadcast(None, root_host, hdr)
            if host is not None:
                host.share(arr, hdr)
            return arr
        assert host is not None  # not a leader, so not alone on its host
        return host.receive(hdr)

    def allgather(self, x: np.ndarray, hdr: wire.OpHeader) -> tuple[np.ndarray, list[int]]:
        host = self.host
        if host is not None:
            block, rows = host.allgather(x, hdr)
        else:
            block, rows = x, [x.shape[0]]
        if len(self.plan.groups) == 1:
            return block, rows  # one host: its members are every rank, in rank order
        if not self.is_leader:
            assert host is not None
            counts = host.receive(hdr)
            return host.receive(hdr), [int(c) for c in counts]
        out, rows = self._gather_hosts(block, rows, hdr)
        if host is not None:
            host.share(np.asarray(rows, dtype=np.int64), hdr)
            host.share(out, hdr)
        return out, rows

    def _gather_hosts(
        self, block: np.ndarray, rows: list[int], hdr: wire.OpHeader
    ) -> tuple[np.ndarray, list[int]]:
        """The leaders' part of allgather: every host's ``block`` (its members' rows in
        rank order, ``rows`` of each) gathered and put in rank order."""
        assert self.ring is not None
        blobs = self.ring.exchange(np.asarray(rows, dtype="<i8").tobytes(), hdr)
        rows_of = [0] * self.size
        for g, (members, blob) in enumerate(zip(self.plan.groups, blobs)):
            counts = np.frombuffer(blob, dtype="<i8")
            if counts.size != len(members) or (counts < 0).any():
                raise Mismatch(f"host leader {members[0]} sent bad row counts for host {g}")
            for m, c in zip(members, counts):
                rows_of[m] = int(c)
        gathered, _ = self.ring.allgather(block, hdr)
        order = [m for members in self.plan.groups for m in members]
        if order == sorted(order):
            return gathered, rows_of
        # Hosts hold interleaved ranks: move each member's rows to its rank's place.
        starts = np.concatenate([[0], np.cumsum(rows_of)])
        out = np.empty_like(gathered)
        at = 0
        for m in order:
            out[starts[m] : starts[m] + rows_of[m]] = gathered[at : at + rows_of[m]]
            at += rows_of[m]
        return out, rows_of

    def barrier(self, hdr: wire.OpHeader) -> None:
        if self.host is not None:
            self.host.barrier(hdr)
        if self.ring is not None:
            self.ring.barrier(hdr)
        if self.host is not None:
            self.host.barrier(hdr)

    # --- life -------------------------------------------------------------------------

    def abort(self, orderly: bool) -> None:
        if self.links is not None:
            self.links.abort(orderly)
        if self.host is not None:
            self.host.abort(orderly)

    def close(self) -> None:
        if self.overlap is not None:
            # A network step an error left running ends once ``abort`` shut its
            # connections; it must before the shared memory it works in is unmapped.
            self.overlap.close()
        if self.links is not None:
            self.links.close()
        if self.host is not None:
            self.host.close()
