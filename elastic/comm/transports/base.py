"""The one interface every way of moving a round's collective bytes implements.

A ``RingCommunicator`` owns the round: its connections to both ring neighbours, the
failure monitor, the broken state and the public API. How the bytes of a collective
travel is its transport's job, chosen once at setup by every member together
(``selection.open_transport``) and then called the same way whatever it is:

* ``TcpRing`` (``tcp_ring.py``): the pipelined TCP ring over the two neighbour
  connections, for members on different hosts (or ``transport="tcp"``);
* ``ShmGroup`` (``shm.py``): shared memory, when every member is on this host;
* ``HierTransport`` (``hier.py``): shared memory inside each host and a TCP ring among
  one leader per host, when members share some hosts but not all;
* ``LocalTransport`` (here): a world of one.

Each is opened from a ``TransportContext`` by the agreement in ``selection.py``; one
that runs inner rings or groups reports members by their rank in the round.

The communicator checks the arguments (``base.Communicator``), builds the ``OpHeader``
that every rank checks against its peers', runs one collective at a time, and turns
what a transport raises into the public errors. A transport raises only
``Interrupted`` (the communicator broke while it waited: from its ``check``),
``Mismatch`` (the ranks disagree on the call) or ``PeerGone`` (a member stopped taking
part; the communicator then works out whether it closed on purpose or was lost), plus
``TimeoutError`` from a setup ``exchange`` that passed its deadline.
"""

from __future__ import annotations

import abc
import socket
from dataclasses import dataclass
from typing import Callable

import numpy as np

from elastic.comm import wire
from elastic.comm.base import CommSettings


class Interrupted(Exception):
    """Internal: the communicator broke while a transport was waiting."""


class Mismatch(Exception):
    """Internal: the ranks disagree on the collective (the message says how)."""


class PeerGone(Exception):
    """Internal: rank ``rank`` stopped taking part in a collective (its connection failed
    or it marked itself closed). ``orderly`` is True when it is known to have closed on
    purpose, None when the transport cannot tell."""

    def __init__(self, rank: int, detail: str, orderly: bool | None = None):
        super().__init__(rank, detail)
        self.rank = rank
        self.detail = detail
        self.orderly = orderly

    def __str__(self) -> str:
        return f"rank {self.rank}: {self.detail}"


Check = Callable[[], None]
"""Raises ``Interrupted`` once the owning communicator is broken; transports call it
whenever they are about to wait."""


class Transport(abc.ABC):
    """Moves the bytes of one collective among every member of a round.

    Every member calls the same methods in the same order with equal headers; each
    method checks its peers' headers and raises ``Mismatch`` when they differ. Inputs
    are contiguous, validated arrays; a transport never modifies them. One collective at
    a time (the communicator serialises calls); ``abort`` may come from any thread.
    All collectives raise ``Interrupted``, ``Mismatch`` or ``PeerGone``.
    """

    name: str
    """How bytes move, reported as ``Communicator.transport``: "local", "tcp", "shm",
    "hier"."""

    @abc.abstractmethod
    def allreduce(self, x: np.ndarray, out: np.ndarray, op: str, hdr: wire.OpHeader) -> None:
        """Reduce every member's flat ``x`` with ``op`` into flat ``out`` (same size and
        dtype; every member gets the same bits)."""

    @abc.abstractmethod
    def broadcast(self, x: np.ndarray | None, root: int, hdr: wire.OpHeader) -> np.ndarray:
        """A new array equal to ``root``'s ``x`` (others pass None)."""

    @abc.abstractmethod
    def allgather(self, x: np.ndarray, hdr: wire.OpHeader) -> tuple[np.ndarray, list[int]]:
        """Every member's ``x`` (at least 1-d) concatenated on axis 0 in rank order, and
        how many rows each member gave."""

    @abc.abstractmethod
    def barrier(self, hdr: wire.OpHeader) -> None:
        """Return once every member has arrived."""

    @abc.abstractmethod
    def abort(self, orderly: bool) -> None:
        """The communicator broke (``orderly``: closed on purpose, not a failure): wake
        whatever this member waits on here, and tell members waiting on this one that it
        will not come. Called from any thread, possibly a signal handler, under the
        communicator's lock: it must not block. Idempotent."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the transport holds. No collective is running. Idempotent."""


class LocalTransport(Transport):
    """A world of one: every collective is a copy."""

    name = "local"

    def allreduce(self, x: np.ndarray, out: np.ndarray, op: str, hdr: wire.OpHeader) -> None:
        np.copyto(out, x)

    def broadcast(self, x: np.ndarray | None, root: int, hdr: wire.OpHeader) -> np.ndarray:
        assert x is not None  # the root is this member
        return x.copy()

    def allgather(self, x: np.ndarray, hdr: wire.OpHeader) -> tuple[np.ndarray, list[int]]:
        return x.copy(), [x.shape[0]]

    def barrier(self, hdr: wire.OpHeader) -> None:
        pass

    def abort(self, orderly: bool) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class TransportContext:
    """What a transport may use while it is opened, during the communicator's setup.

    ``ring`` is the TCP ring over this member's two neighbour connections (connected and
    ready; it is the transport for "tcp"). ``exchange(blob)`` returns every member's blob
    in rank order (a ring allgather, so also a barrier) before ``deadline``; every member
    must call it the same number of times. For transports that need connections beyond
    the two neighbours (e.g. between host leaders), ``dial(rank, channel)`` connects to
    that member's listener and ``claim(rank, channel)`` takes the connection that member
    dialled here, both authenticated and bounded by ``deadline``; such a transport uses a
    channel of its own (``wire.CHANNELS``), owns those sockets, shuts them down in
    ``abort`` and closes them in ``close``.
    """

    rank: int
    size: int
    settings: CommSettings
    ring: Transport
    exchange: Callable[[bytes], list[bytes]]
    dial: Callable[[int, int], socket.socket]
    claim: Callable[[int, int], socket.socket]
    deadline: float
    check: Check


def gather_layout(
    metas: list[tuple[np.dtype, tuple[int, ...]]],
) -> tuple[np.dtype, tuple[int, ...], list[int]]:
    """(dtype, output shape, byte offsets of each rank's block) of an allgather whose
    members sent arrays of ``metas`` (dtype, shape).

    Raises:
        Mismatch: the dtypes or the dimensions after the first differ.
    """
    dtype, shape0 = metas[0]
    for j, (dt, sh) in enumerate(metas):
        if dt != dtype:
            raise Mismatch(f"allgather dtypes differ: rank 0 has {dtype}, rank {j} has {dt}")
        if len(sh) == 0 or tuple(sh[1:]) != tuple(shape0[1:]):
            raise Mismatch(
                f"allgather shapes differ beyond axis 0: rank 0 has {shape0}, rank {j} has {sh}"
            )
    rows = [sh[0] for _, sh in metas]
    row_bytes = int(np.prod(shape0[1:], dtype=np.int64)) * dtype.itemsize
    offsets = [0]
    for k in rows:
        offsets.append(offsets[-1] + k * row_bytes)
    return dtype, (sum(rows),) + tuple(shape0[1:]), offsets
