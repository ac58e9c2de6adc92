"""The ``"agent"`` round feed: the worker registers and learns its rounds through its
host's agent (``rendezvous.host_channel``; the agent's end: ``driver.agent.workers``).

The worker connects to the agent's socket, sends its ``WorkerInfo`` and waits for the
agent to answer that the registration is written (under the agent's lease). Rounds
arrive on the same connection, the newest first, each as this host reads it. Nothing
here holds a lease or a watch of the store.

The connection is the registration: it closes when the worker's process ends, and the
agent deletes the registration then. The worker never closes it itself (``close`` only
stops reading), as a worker with its own lease never revokes it. If the agent goes (its
end closes), nobody registers this worker or tells it its rounds: the agent's host is
lost to the job, and the worker ends itself (``cut_off``) as an orphan does; a fresh
agent there runs fresh workers.
"""

from __future__ import annotations

import logging
import socket
import threading

from elastic.follow.base import FeedHooks, FeedSettings
from rendezvous.errors import RendezvousConnectionError, RendezvousError
from rendezvous.host_channel import (
    ChannelClosedError,
    MessageReader,
    Refused,
    Register,
    Registered,
    RoundNews,
    send,
)
from rendezvous.schema.workers import WorkerInfo

log = logging.getLogger(__name__)

#: seconds the agent has to answer a registration (one store write)
REGISTER_TIMEOUT = 60.0


class AgentFeed:
    """A ``RoundFeed`` through the agent at ``settings.agent_socket`` (see the module
    docstring)."""

    def __init__(
        self,
        settings: FeedSettings,
        hooks: FeedHooks,
    ):
        self._settings = settings
        self._on_round = hooks.on_round
        self._newest = hooks.newest
        self._closed = hooks.closed
        self._cut_off = hooks.cut_off
        self._sock: socket.socket | None = None
        self._answered = threading.Event()
        self._answer: Registered | Refused | None = None

    @property
    def lease_id(self) -> int:
        answer = self._answer
        return answer.lease_id if isinstance(answer, Registered) else 0

    def start(self, info: WorkerInfo) -> None:
        """Raises:
        RendezvousError: the agent cannot be reached, or cannot register the worker."""
        path = self._settings.agent_socket
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise RendezvousConnectionError(
                f"cannot reach this host's agent at {path}: {exc}"
            ) from None
        self._sock = sock
        threading.Thread(
            target=self._follow, args=(sock,), name="elastic-rounds", daemon=True
        ).start()
        send(sock, Register(info))
        if not self._answered.wait(REGISTER_TIMEOUT) or self._answer is None:
            raise RendezvousConnectionError(
                f"this host's agent did not register worker {info.worker_id} "
                f"within {REGISTER_TIMEOUT:.0f}s"
            )
        if isinstance(self._answer, Refused):
            raise RendezvousError(f"this host's agent cannot register it: {self._answer.reason}")

    def close(self) -> None:
        """Stop reading: the connection itself ends with the process (module docstring)."""

    def _follow(self, sock: socket.socket) -> None:
        reader = MessageReader(sock)
        while not self._closed.is_set():
            try:
                message = reader.next()
            except ChannelClosedError as exc:
                self._answered.set()  # a start still waiting gives up
                if not self._closed.is_set():
                    log.error("this host's agent is gone (%s): stopping this worker", exc)
                    self._cut_off()
                return
            except ValueError as exc:
                log.warning("ignoring a message of this host's agent: %s", exc)
                continue
            if isinstance(message, (Registered, Refused)):
                self._answer = message
                self._answered.set()
            elif isinstance(message, RoundNews):
                self._take(message)

    def _take(self, news: RoundNews) -> None:
        try:
            view = news.view()
        except ValueError as exc:
            log.warning("ignoring a round that does not parse: %s", exc)
            return
        if view.round_id > self._newest():
            self._on_round(view)
