"""What the agent's threads tell its loop (``driver.agent.loop``): one small frozen class
per kind of news (the store feeds, the process waiters, a signal)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from rendezvous.host_plan import RoundView
from rendezvous.store import KeyValue


@dataclass(frozen=True)
class Assigned:
    key: str
    value: bytes | None  # None: deleted


@dataclass(frozen=True)
class AssignedAll:
    kvs: Sequence[KeyValue]


@dataclass(frozen=True)
class LeaderSeen:
    term: int | None


@dataclass(frozen=True)
class LeaderRecheck:
    """The store is back after an outage: read the leader record afresh."""


@dataclass(frozen=True)
class RoundChanged:
    """A newer round, as this host reads it (its members' ranks)."""

    view: RoundView


@dataclass(frozen=True)
class Ended:
    pass


@dataclass(frozen=True)
class Exited:
    id: str
    code: int


@dataclass(frozen=True)
class ShutdownAsked:
    reason: str
    drain: bool = False  # the scheduler's preemption: drain first (``request_drain``)


News = Union[
    Assigned, AssignedAll, LeaderSeen, LeaderRecheck, RoundChanged, Ended, Exited, ShutdownAsked
]
