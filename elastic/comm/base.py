"""The communicator interface shared by the ring (TCP / shared memory) and MPI backends.

Errors a collective can raise (all typed):

* ``PeerLostError`` (a ``WorkerLostError``): a member of the round died, stopped
  answering for ``peer_timeout``, or its connection broke. Every survivor's pending
  and next collective raise it; the communicator stays broken.
* ``CommunicatorClosedError`` (a ``WorkerLostError``): this communicator was closed
  (``close()``, possibly from another thread), or a peer closed its own on purpose
  (usually because a new round arrived there first).
* ``CollectiveMismatchError``: ranks called different collectives (or the same one
  with different op, dtype, shape or root). A programming error, not recoverable by
  re-forming; the communicator is broken afterwards.
* ``ValueError`` / ``TypeError``: a bad argument found before any communication;
  the communicator stays usable (no rank consumed the call).
"""

from __future__ import annotations

import abc
import pickle
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from elastic.comm import layout
from elastic.errors import (
    CollectiveMismatchError,
    CommunicatorClosedError,
    PeerLostError,
    ShmUnavailableError,
    WorkerLostError,
)

TRANSPORTS = ("auto", "tcp", "shm", "hier")


@dataclass(frozen=True)
class CommSettings:
    """Tuning and failure-detection knobs of a ring communicator.

    connect_timeout: seconds to build a communicator (connect, handshake, shm setup)
        before ``WorkerLostError`` names the peer that never showed up.
    peer_timeout: seconds without a heartbeat after which a live-looking neighbour
        (e.g. SIGSTOPped) is declared lost. A killed peer is seen at once regardless.
    suspect_after: seconds without a heartbeat after which a neighbour is reported
        *silent* (``on_peer_silent``), not lost: the driver then checks whether its host
        still answers at all (a host cut off the network sends no FIN and no RST, so
        silence is its only sign) and drops the whole host if not. A busy process keeps
        its heartbeats going from the monitor thread; a false suspicion costs one probe.
    heartbeat_interval: seconds between heartbeats; None means
        ``min(0.1, suspect_after / 4, peer_timeout / 4)``.
    transport: "auto" (shared memory when every member is on this host; the TCP ring when
        no two members share a host; otherwise hierarchical: shared memory inside each
        host and a TCP ring among one leader per host), "tcp" (always the TCP ring),
        "shm" (shared memory or ``ShmUnavailableError``) or "hier" (hierarchical whatever
        the placement, or ``ShmUnavailableError`` when a host's members cannot share
        memory). See ``elastic.comm.transports.selection``.
    chunk_bytes: pipelining unit of the TCP ring.
    shm_piece_bytes: size of each of the two shared-memory slots per rank; arrays
        larger than this stream through in pieces (each costs two barriers; 4 MiB beat
        1 MiB on the 2-core test VM under load, where every barrier may wait for a
        descheduled rank). A hierarchical allreduce streams half-slot pieces
        (``layout.hier_piece_bytes``).
    shm_spin_us: microseconds a shared-memory wait spins before sleeping in the
        kernel; None spins only when every thread a collective keeps busy on this host
        can have its own CPU.
    leader_overlap: whether a host leader of a hierarchical round runs its network
        steps on a second thread, beside its host's shared-memory steps on the next
        piece. None does so only when the host has a CPU for that thread besides one
        per member: without a spare CPU the thread takes its time from the members'
        copies, and the allreduce gets slower (64 MiB on 2 test hosts x 2 members on 2
        CPUs, 4 MiB pieces: a median 55-59 ms without, 61-67 ms with).
    close_grace: seconds a broken connection waits for the peer's reason (an orderly
        close vs a crash) before it is reported as a lost peer.
    socket_buffer_bytes: SO_SNDBUF/SO_RCVBUF of the data connections; None leaves
        them to the kernel's autotuning.
    """

    connect_timeout: float = 30.0
    peer_timeout: float = 30.0
    suspect_after: float = 0.8
    heartbeat_interval: float | None = None
    transport: str = "auto"
    chunk_bytes: int = 1 << 19
    shm_piece_bytes: int = 4 << 20
    shm_spin_us: float | None = None
    leader_overlap: bool | None = None
    close_grace: float = 0.2
    socket_buffer_bytes: int | None = None

    def __post_init__(self):
        for name in ("connect_timeout", "peer_timeout", "suspect_after", "close_grace"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.heartbeat_interval is not None and not (
            0 < self.heartbeat_interval < self.peer_timeout
        ):
            raise ValueError("heartbeat_interval must be > 0 and < peer_timeout")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}")
        if self.chunk_bytes < 4096 or self.shm_piece_bytes < 4096:
            raise ValueError("chunk_bytes and shm_piece_bytes must be >= 4096")
        if self.shm_spin_us is not None and self.shm_spin_us < 0:
            raise ValueError("shm_spin_us must be >= 0")
        if self.leader_overlap not in (None, True, False):
            raise ValueError("leader_overlap must be True, False or None")

    @property
    def effective_heartbeat_interval(self) -> float:
        if self.heartbeat_interval is not None:
            return self.heartbeat_interval
        return min(0.1, self.suspect_after / 4, self.peer_timeout / 4)


@dataclass(frozen=True)
class Membership:
    """One round as this worker sees it: ``addresses`` of the members in rank order
    (each a listener's ``host:port``), this worker's ``rank``, and the job secret.

    ``addresses`` is every member's, or (``world`` set: the round's size) a mapping
    from rank to address that knows at least the members this worker connects to: a
    worker of a large round holds its neighbours' addresses, not the world's
    (``rendezvous.host_plan``); a mapping may look a rank up when asked.

    Raises ValueError when the rank is out of range or addresses are empty."""

    round_id: int
    rank: int
    addresses: Sequence[str] | Mapping[int, str]  # a sequence is kept as a tuple
    secret: str = field(repr=False)  # never printed in logs or tracebacks
    world: int = 0  # the round's size when ``addresses`` is a mapping

    def __post_init__(self):
        if not isinstance(self.addresses, Mapping):
            object.__setattr__(self, "addresses", tuple(self.addresses))
            object.__setattr__(self, "world", len(self.addresses))
        if self.world < 1:
            raise ValueError("a membership needs at least one address")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} out of range for {self.world} members")
        if self.round_id < 0:
            raise ValueError("round_id must be >= 0")
        if not self.secret:
            raise ValueError("the job secret is required")

    @property
    def size(self) -> int:
        return self.world

    def address_of(self, rank: int) -> str:
        """The address of member ``rank``.

        Raises:
            KeyError: the membership does not know it (a mapping that cannot look it up)."""
        return self.addresses[rank]


FailureCallback = Callable[[PeerLostError], Any]


class Communicator(abc.ABC):
    """Collectives over the members of one round.

    All ranks must call the same collectives in the same order. Collectives return
    new arrays and never modify their input. One collective at a time per
    communicator (a second concurrent call raises RuntimeError); ``close`` may be
    called from any thread at any time.

    An implementation sets ``_rank`` and ``_size`` and implements the abstract methods.
    The public collectives check their arguments here, before any communication, and
    hand validated arrays to ``_allreduce``, ``_broadcast`` and ``_allgather_rows``.
    """

    _rank: int
    _size: int

    @property
    def rank(self) -> int:
        """This member's rank, from 0 to ``size - 1``."""
        return self._rank

    @property
    def size(self) -> int:
        """How many members the communicator has."""
        return self._size

    @property
    def transport(self) -> str:
        """How bytes move: "local" (world of one), "tcp", "shm", "hier" or "mpi"."""
        return "local"

    def allreduce(self, x, op: str = "sum") -> np.ndarray:
        """Elementwise reduction of every rank's ``x`` (same shape and dtype everywhere);
        ``op`` is "sum", "average", "max" or "min". Every rank gets a bit-identical
        result of ``x``'s shape and dtype; an integer "average" is floor-divided.

        Raises ValueError (unknown op), TypeError (non-numeric dtype),
        CollectiveMismatchError, PeerLostError, CommunicatorClosedError."""
        layout.check_reduce_op(op)
        arr = layout.as_contiguous(x)
        layout.check_reduce_dtype(arr.dtype)
        return self._allreduce(arr, op)

    @abc.abstractmethod
    def _allreduce(self, arr: np.ndarray, op: str) -> np.ndarray:
        """The allreduce of ``arr`` (contiguous, a reducible dtype; ``op`` is known)."""

    def broadcast(self, x, root: int = 0) -> np.ndarray:
        """``root``'s ``x`` on every rank (its shape and dtype; other ranks' ``x`` is
        ignored and may be None).

        Raises ValueError (root out of range), TypeError (object dtype),
        CollectiveMismatchError, PeerLostError, CommunicatorClosedError."""
        if not 0 <= root < self.size:
            raise ValueError(f"root {root} out of range for {self.size} ranks")
        arr = None
        if self.rank == root:
            arr = layout.as_contiguous(x)
            layout.check_transfer_dtype(arr.dtype)
        return self._broadcast(arr, root)

    @abc.abstractmethod
    def _broadcast(self, arr: np.ndarray | None, root: int) -> np.ndarray:
        """The broadcast from ``root`` (valid), whose contiguous ``arr`` of a transferable
        dtype is given there (None elsewhere)."""

    def allgather(self, x) -> np.ndarray:
        """Every rank's ``x`` concatenated on axis 0 in rank order. First dimensions may
        differ; dtype and the other dimensions must agree (0-d arrays count as (1,)).

        Raises TypeError (object dtype), CollectiveMismatchError (dtype or trailing
        shape differ), PeerLostError, CommunicatorClosedError."""
        arr = layout.as_contiguous(x)
        layout.check_transfer_dtype(arr.dtype)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        return self._allgather_rows(arr)[0]

    @abc.abstractmethod
    def _allgather_rows(self, arr: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """The allgather of ``arr`` (contiguous, at least 1-d, a transferable dtype) and
        how many rows each rank gave. Raises like ``allgather``."""

    def broadcast_object(self, obj: Any = None, root: int = 0) -> Any:
        """``root``'s picklable ``obj`` on every rank. Peers are authenticated members of
        the job, so their pickles are trusted. Raises like ``broadcast``."""
        payload = pickle_to_array(obj) if self.rank == root else None
        return array_to_object(self.broadcast(payload, root))

    def allgather_object(self, obj: Any) -> list:
        """Every rank's picklable ``obj``, as a list in rank order. Raises like ``allgather``."""
        out, rows = self._allgather_rows(pickle_to_array(obj))
        parts, start = [], 0
        for count in rows:
            parts.append(array_to_object(out[start : start + count]))
            start += count
        return parts

    @abc.abstractmethod
    def barrier(self) -> None:
        """Returns once every rank has entered the barrier.
        Raises PeerLostError, CommunicatorClosedError, CollectiveMismatchError."""

    @abc.abstractmethod
    def close(self, reason: str = "") -> None:
        """Release the communicator. Thread-safe and idempotent; a collective blocked in
        another thread raises CommunicatorClosedError at once, and so does every later
        call. Peers see an orderly close (CommunicatorClosedError, not a lost peer)."""

    @property
    def closed(self) -> bool:
        """True once the communicator can no longer run collectives (closed or broken)."""
        return False

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Block until ``closed`` (True) or for ``timeout`` seconds (False); any thread.
        What runs beside the communicator in its round (``elastic.torch``'s process
        groups) ends with it. This default looks every 50 ms; the ring waits on the
        event its break sets."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.closed:
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                return False
            time.sleep(left)
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close("context exit")


def pickle_to_array(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)


def array_to_object(arr: np.ndarray) -> Any:
    return pickle.loads(arr.tobytes())


__all__ = [
    "CommSettings",
    "Membership",
    "Communicator",
    "PeerLostError",
    "CollectiveMismatchError",
    "ShmUnavailableError",
    "CommunicatorClosedError",
    "WorkerLostError",
    "FailureCallback",
    "TRANSPORTS",
]
