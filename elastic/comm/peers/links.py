"""``NeighbourLinks``: a ring member's four connections to its two neighbours, and the
``Connector`` that makes a round's connections.

Rank r dials rank r+1 and takes the connections rank r-1 dialled to it, twice: a
*data* connection (collective payloads; r sends on the one it dialled and receives on
the one it accepted) and a *control* connection (heartbeats and close/abort notices).
This holds them from the moment each is made, so that a communicator that breaks while
it is still connecting can shut down what it already has, and it owns their end:
``notify`` sends the last word, ``shutdown`` wakes whoever waits on them, ``close``
releases them so that the last word arrives (FIN, not RST).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Sequence
from typing import Callable

from elastic.comm import wire
from elastic.comm.base import Membership
from elastic.comm.peers.listener import InFlightDials, RingListener, StopCheck, dial
from elastic.errors import LossCause, PeerLostError

Connect = Callable[[int, int], socket.socket]
"""``connect(rank, channel)``: an authenticated connection to or from member ``rank``."""

Check = Callable[[], None]
"""Raises once the communicator that owns the links is broken (the transports'
``Check``: the links sit below the transports and import none of them)."""


class Connector:
    """Authenticated connections between ``membership``'s members for its round, made
    through this worker's ``listener`` before ``deadline`` (monotonic), given up early
    when ``stop()`` gives a reason, and at once on ``abort``. The caller owns every
    socket it gets."""

    def __init__(
        self, membership: Membership, listener: RingListener, deadline: float, stop: StopCheck
    ):
        self._membership = membership
        self._listener = listener
        self._deadline = deadline
        self._stop = stop
        self._dials = InFlightDials()

    def abort(self, reason: str) -> None:
        """End every dial under way and to come (``InFlightDials.abort``): what breaks the
        communicator being built calls it, so that no dial waits on a vanished peer.
        Never blocks. (A ``claim`` ends within its poll of ``stop()``.)"""
        self._dials.abort(reason)

    def dial(self, rank: int, channel: int) -> socket.socket:
        """A connection to member ``rank``'s listener (see ``listener.dial``)."""
        m = self._membership
        return dial(
            m.address_of(rank),
            m.secret,
            channel,
            m.round_id,
            m.rank,
            rank,
            m.size,
            self._deadline,
            self._stop,
            self._dials,
        )

    def claim(self, rank: int, channel: int) -> socket.socket:
        """The connection member ``rank`` dialled here (see ``RingListener.claim``)."""
        m = self._membership
        return self._listener.claim(
            m.round_id, rank, channel, m.rank, m.size, self._deadline, self._stop
        )


class NeighbourLinks:
    """The connections of rank ``rank`` of ``size`` (at least 2) to both neighbours.

    ``ring`` lists the members in ring order when the ring is not every rank in rank
    order (the host leaders of a hierarchical round: ``rank`` must be one of them);
    ``channels`` are the (data, control) channels the connections are made on.
    """

    def __init__(
        self,
        rank: int,
        size: int,
        *,
        ring: Sequence[int] | None = None,
        channels: tuple[int, int] = (wire.CHANNEL_DATA, wire.CHANNEL_CTRL),
    ):
        members = list(ring) if ring is not None else list(range(size))
        at = members.index(rank)
        self.left = members[(at - 1) % len(members)]
        self.right = members[(at + 1) % len(members)]
        self._channels = channels
        # Re-entrant: shutdown() may run in a signal handler that interrupted a thread
        # inside one of the short locked sections.
        self._lock = threading.RLock()
        self._socks: list[socket.socket] = []
        self._control: list[socket.socket] = []
        self._closed = False

    def connect(
        self, dial: Connect, claim: Connect, connect_timeout: float, check: Check
    ) -> tuple[socket.socket, socket.socket, socket.socket, socket.socket]:
        """Dial the right neighbour and claim the left one's connections (data, then
        control); ``check()`` runs after each is held. Returns them as non-blocking
        ``(data_left, data_right, control_left, control_right)``.

        Raises:
            PeerLostError: a neighbour did not answer or connect in time (it is named).
            whatever ``dial``, ``claim`` or ``check`` raise.
        """
        data_right, control_right = self._connect(
            self.right, dial, "answer", connect_timeout, check
        )
        data_left, control_left = self._connect(self.left, claim, "connect", connect_timeout, check)
        for sock in self._socks:
            sock.setblocking(False)
        return data_left, data_right, control_left, control_right

    def _connect(
        self, rank: int, connect: Connect, failed: str, connect_timeout: float, check: Check
    ) -> tuple[socket.socket, socket.socket]:
        try:
            data = self._hold(connect(rank, self._channels[0]), check)
            return data, self._hold(connect(rank, self._channels[1]), check, control=True)
        except TimeoutError as e:
            raise PeerLostError(
                f"rank {rank} did not {failed} within {connect_timeout:g} s ({e})",
                rank=rank,
                direct=True,
                cause=LossCause.SILENT,
            ) from None

    def _hold(self, sock: socket.socket, check: Check, control: bool = False) -> socket.socket:
        with self._lock:
            if self._closed:
                sock.close()
            else:
                self._socks.append(sock)
                if control:
                    self._control.append(sock)
        check()
        return sock

    def notify(self, message: bytes) -> None:
        """Send ``message`` on both control connections without waiting (best effort)."""
        with self._lock:
            for sock in self._control:
                with contextlib.suppress(OSError):
                    sock.send(message, socket.MSG_DONTWAIT)

    def shutdown(self) -> None:
        """Shut every connection down: whoever waits on one wakes, neighbours see EOF."""
        with self._lock:
            for sock in self._socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close every connection (idempotent). Control connections are drained first, so
        the kernel sends FIN, not an RST that could destroy a notice before the neighbour
        reads it."""
        with self._lock:
            socks, control = self._socks, self._control
            self._socks, self._control, self._closed = [], [], True
        for sock in socks:
            if sock in control:
                with contextlib.suppress(OSError):
                    while sock.recv(65536, socket.MSG_DONTWAIT):
                        pass
            sock.close()
