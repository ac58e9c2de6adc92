"""How a worker reads the job's rounds: the head it follows, and its host's part of
each round, read once (``rendezvous.host_plan``). A worker decodes a constant amount
per round, whatever the job's size; the addresses it lacks (a hierarchical ring whose
hosts are not the driver's) are looked up in the whole plan, once per round, when a
connection asks for them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping

from rendezvous.errors import RendezvousError
from rendezvous.host_plan import RoundHead, RoundView, plan_digest, read_view
from rendezvous.keys import JobKeys
from rendezvous.retry import Backoff
from rendezvous.schema.rounds import Plan
from rendezvous.store import KVStore, Watch

log = logging.getLogger(__name__)


class RoundReader:
    """Reads rounds for the workers of ``host`` through ``store`` (``keys``: the job's),
    until ``closed``."""

    def __init__(self, store: KVStore, keys: JobKeys, host: str, closed: threading.Event):
        self._store = store
        self._keys = keys
        self._host = host
        self._closed = closed

    @property
    def key(self) -> str:
        """The key whose changes are rounds (a watch's events of other keys are not)."""
        return self._keys.plan_head

    def read_and_watch(self) -> tuple[list[RoundView], Watch]:
        """The current round (none before the first), then a watch of the head from
        just after that read.

        Raises:
            RendezvousError: the store cannot be used."""
        kvs, watch = self._store.read_and_watch(self._keys.plan_head)
        views = []
        for kv in kvs:
            if kv.key == self._keys.plan_head:
                view = self.view(kv.value)
                if view is not None:
                    views.append(view)
        return views, watch

    def view(self, head_value: bytes, newer_than: int = 0) -> RoundView | None:
        """The round of the head ``head_value`` as this host reads it; None when it is
        not newer than round ``newer_than`` (nothing is read), when it is already over,
        when it does not parse (logged), or when the reader closed. Tries again through
        store outages until it is closed.

        Raises nothing."""
        try:
            head = RoundHead.from_json(head_value)
        except ValueError as exc:
            log.warning("ignoring a round head that does not parse: %s", exc)
            return None
        if head.round_id <= newer_than:
            return None
        backoff = Backoff(None, initial=0.05, cap=1.0, stop=self._closed)
        while not self._closed.is_set():
            try:
                return read_view(self._store.get, self._keys, head, self._host)
            except ValueError as exc:
                log.warning("ignoring round %d: its part does not parse: %s", head.round_id, exc)
                return None
            except RendezvousError as exc:
                log.warning("cannot read round %d yet: %s", head.round_id, exc)
            if not backoff.pause():
                break
        return None

    def current(self) -> RoundView | None:
        """The round the store holds now (None: none, or it ended meanwhile).

        Raises:
            RendezvousError: the store cannot be used."""
        kv = self._store.get(self._keys.plan_head)
        return self.view(kv.value) if kv is not None else None

    def addresses(self, view: RoundView) -> RankAddresses:
        """The members' addresses of ``view``'s round, as a connection asks for them."""
        return RankAddresses(view, self._store, self._keys)


class RankAddresses(Mapping[int, str]):
    """The data-plane address of each member of a round: those of the host's part at
    once, any other read from the whole plan (``JobKeys.round``) the first time one is
    asked for, if that is still the round.

    A missing rank raises ``KeyError`` (the caller's connection then fails, as one to
    a member that is gone)."""

    def __init__(self, view: RoundView, store: KVStore, keys: JobKeys):
        self._view = view
        self._store = store
        self._keys = keys
        self._all: tuple[str, ...] | None = None
        self._lock = threading.Lock()

    def __getitem__(self, rank: int) -> str:
        known = self._view.address_of(rank)
        if known is not None:
            return known
        with self._lock:
            if self._all is None:
                self._all = self._read_all()
            if 0 <= rank < len(self._all):
                return self._all[rank]
        raise KeyError(rank)

    def _read_all(self) -> tuple[str, ...]:
        try:
            kv = self._store.get(self._keys.round)
        except RendezvousError as exc:
            log.warning("cannot read round %d's addresses: %s", self._view.round_id, exc)
            return ()
        plan = Plan.from_json(kv.value) if kv is not None else None
        if plan is None or plan_digest(plan) != self._view.head.digest:
            return ()  # the round is over: its connections fail, as they should
        return tuple(m.address for m in plan.members)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._view.size))

    def __len__(self) -> int:
        return self._view.size
