"""The local channel between a host's agent and its workers: the messages and their
framing (one JSON object a line over a Unix stream socket). The agent's end is
``driver.agent.workers``, the worker's ``elastic.follow.agent``.

Where a host has an agent, the agent is the store's only client for its workers'
membership: one lease and one watch of the round's head per host, whatever the number
of workers. A worker connects to the agent's socket (its path in
``rendezvous.env.ENV_AGENT_SOCKET``), says who it is (``Register``), and the agent writes
its registration (``JobKeys.worker``, the same record as a worker's own) under the
agent's lease, answers ``Registered`` with that lease, and forwards it each newer round
as the host reads it (``RoundNews``: the head and the host's part). The connection is
the registration's life: when it closes (the worker's process ended) the agent deletes
the registration at once.

Messages, each ``{"op": ...}``:

* worker to agent: ``register`` (the ``WorkerInfo``);
* agent to worker: ``registered`` (the lease the registration is under), ``refused``
  (why it could not be written), ``round`` (the head and the host's part, as stored).
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Union

from rendezvous.errors import RendezvousError
from rendezvous.host_plan import RoundHead, RoundView, view_from
from rendezvous.schema.workers import WorkerInfo

#: the longest line either end accepts (a host's part of a round is a few KB)
MAX_LINE = 16 << 20


class ChannelClosedError(RendezvousError):
    """The other end of the host channel closed it (its process ended) or broke it."""


@dataclass(frozen=True)
class Register:
    """A worker asks its agent to register it."""

    info: WorkerInfo


@dataclass(frozen=True)
class Registered:
    """The worker is registered, under lease ``lease_id`` (the agent's)."""

    lease_id: int


@dataclass(frozen=True)
class Refused:
    """The agent could not register the worker, for ``reason``."""

    reason: str


@dataclass(frozen=True)
class RoundNews:
    """A newer round as the host reads it: its ``head`` and the host's ``part`` (None:
    no member on this host), each as stored (``rendezvous.host_plan``)."""

    head: bytes
    part: bytes | None

    @classmethod
    def of(cls, view: RoundView) -> RoundNews:
        part = view.part.to_json() if view.part is not None else None
        return cls(view.head.to_json(), part)

    def view(self) -> RoundView:
        """The round it says.

        Raises:
            ValueError: the head or the part does not parse."""
        return view_from(RoundHead.from_json(self.head), self.part)


Message = Union[Register, Registered, Refused, RoundNews]


def encode(message: Message) -> bytes:
    """One line of the channel (pure)."""
    if isinstance(message, Register):
        raw: dict = {"op": "register", "info": message.info.to_json().decode()}
    elif isinstance(message, Registered):
        raw = {"op": "registered", "lease": message.lease_id}
    elif isinstance(message, Refused):
        raw = {"op": "refused", "reason": message.reason}
    else:
        part = message.part.decode() if message.part is not None else None
        raw = {"op": "round", "head": message.head.decode(), "part": part}
    return json.dumps(raw).encode() + b"\n"


def decode(line: bytes) -> Message:
    """The message of one line (pure).

    Raises:
        ValueError: not a message of the channel."""
    try:
        raw = json.loads(line)
        op = raw["op"]
        if op == "register":
            return Register(WorkerInfo.from_json(raw["info"].encode()))
        if op == "registered":
            return Registered(int(raw["lease"]))
        if op == "refused":
            return Refused(str(raw["reason"]))
        if op == "round":
            part = raw["part"]
            return RoundNews(raw["head"].encode(), part.encode() if part is not None else None)
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a host channel message: {exc!r}") from None
    raise ValueError(f"not a host channel message: unknown op {op!r}")


def send(sock: socket.socket, message: Message) -> None:
    """Write ``message`` to ``sock``.

    Raises:
        ChannelClosedError: the other end is gone."""
    try:
        sock.sendall(encode(message))
    except OSError as exc:
        raise ChannelClosedError(f"host channel closed: {exc}") from None


class MessageReader:
    """The messages arriving on ``sock``, one at a time (one reader thread)."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._buffer = b""

    def next(self) -> Message:
        """The next message, waiting for it.

        Raises:
            ChannelClosedError: the other end closed or broke the channel.
            ValueError: a line that is no message (or longer than ``MAX_LINE``)."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE:
                raise ValueError("host channel line too long")
            try:
                chunk = self._sock.recv(65536)
            except OSError as exc:
                raise ChannelClosedError(f"host channel broken: {exc}") from None
            if not chunk:
                raise ChannelClosedError("host channel closed by the other end")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return decode(line)
