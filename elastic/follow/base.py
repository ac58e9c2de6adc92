"""What every round feed is (``elastic.follow``): the interface and its settings."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Protocol

from rendezvous.host_plan import RoundView
from rendezvous.schema.workers import WorkerInfo


class RoundFeed(Protocol):
    """A worker's registration and its rounds."""

    def start(self, info: WorkerInfo) -> None:
        """Follow rounds, then register ``info`` (no round that includes it is missed).

        Raises:
            RendezvousError: the registration cannot be written."""

    @property
    def lease_id(self) -> int:
        """The lease the registration is under (0: not registered): the worker's
        reports are written under it, so they end with it."""

    def close(self) -> None:
        """Stop following rounds. The registration stays until the process exits (a
        registration vanishing while the process runs looks like a hung worker)."""


@dataclass(frozen=True)
class FeedSettings:
    """What a feed needs of the worker's settings: its ``worker_id``, its registration
    lease's ``lease_ttl`` (``"store"``), how long it may be cut off from the job
    (``round_timeout``), and its agent's socket (``agent_socket``; "": none)."""

    worker_id: str
    lease_ttl: int = 10
    round_timeout: float = 600.0
    agent_socket: str = ""


@dataclass(frozen=True)
class FeedHooks:
    """What a feed calls back into its worker with, the same for every feed: ``on_round``
    takes each round newer than ``newest()`` (the newest taken), from the feed's thread;
    ``closed`` is set when the worker shuts down; ``cut_off`` ends the worker when it is
    cut off from its job for good."""

    on_round: Callable[[RoundView], None]
    newest: Callable[[], int]
    closed: threading.Event
    cut_off: Callable[[], None]
