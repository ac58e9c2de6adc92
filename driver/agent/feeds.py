"""The store's feeds of a host's agent (``driver.agent.loop.Agent``): what the agent
follows in the store, each prefix in a daemon thread of its own
(``rendezvous.watch.follow_in_thread``), posted to the agent's queue as ``news``.

* the host's assignments (``news.Assigned``, ``news.AssignedAll`` at a resync);
* the leader record (``news.LeaderSeen``: its term, None when gone or unreadable);
* the round: this host's parts and the head; the part is read here, on the feed's
  thread, so the loop does no I/O for it, and handed to the workers at once
  (``publish``) before the agent's next turn (``news.RoundChanged``);
* the job's end (``news.Ended``);
* this agent's retirement (``news.ShutdownAsked(RETIRED)``), only when it names this
  agent: one written for an agent before it on this host must not stop it.

Why apart from the loop: these threads touch none of the loop's state; they only read
the store and post, as the driver's feeds do (``driver.job.feeds``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Callable

from driver.agent import news
from driver.agent.settings import AgentIdentity
from rendezvous.errors import RendezvousError
from rendezvous.host_plan import LatestParts, RoundHead, RoundView, read_view
from rendezvous.keys import JobKeys
from rendezvous.schema.agents import leader_term
from rendezvous.store import PUT, Event, KeyValue, KVStore
from rendezvous.watch import follow_in_thread

log = logging.getLogger(__name__)

RETIRED = "retired: discovery removed its host"
"""Why an agent the leader retired (``JobKeys.retire``) ends."""


def follow_store(
    store: KVStore,
    keys: JobKeys,
    identity: AgentIdentity,
    *,
    post: Callable[[news.News], None],
    publish: Callable[[RoundView], None],
    stop: threading.Event,
    patience: float,
    clock: Callable[[], float],
) -> None:
    """Follow the feeds of the agent ``identity`` in job ``keys`` until ``stop``; each
    piece of news goes to ``post``, each round of this host also to ``publish`` (its
    workers). ``patience``: how long a feed may be cut off before it says the leader is
    unseen (``news.LeaderSeen(None)``, the agent's --driver-timeout clock)."""
    host = identity.host

    leader_key = keys.driver

    def leader_event(event: Event) -> None:
        if event.key == leader_key:
            post(news.LeaderSeen(leader_term(event.value) if event.type == PUT else None))

    def leader_resync(kvs: Sequence[KeyValue]) -> None:
        value = next((kv.value for kv in kvs if kv.key == leader_key), None)
        post(news.LeaderSeen(leader_term(value)))

    parts = LatestParts()  # this host's parts, as their watch delivers them

    def round_read(head_value: bytes) -> None:
        # This host's part of the round, read here: the loop does no I/O for it
        # (and this thread none when the part's event came first).
        try:
            head = RoundHead.from_json(head_value)
            view = read_view(store.get, keys, head, host, parts.get)
        except (ValueError, RendezvousError) as exc:
            log.warning("agent of %s: unreadable round: %s", host, exc)
            return
        if view is not None:
            publish(view)  # to the workers at once, not after a turn
            post(news.RoundChanged(view))

    def round_resync(kvs: Sequence[KeyValue]) -> None:
        for kv in kvs:
            if kv.key == keys.plan_head:
                round_read(kv.value)

    retire_key, agent_id = keys.retire(host), identity.agent_id.encode()

    def retire_event(event: Event) -> None:
        # Only a retirement naming this agent: one written for an agent before it
        # on this host must not stop it.
        if event.type == PUT and event.key == retire_key and event.value == agent_id:
            post(news.ShutdownAsked(RETIRED))

    def retire_resync(kvs: Sequence[KeyValue]) -> None:
        if any(kv.key == retire_key and kv.value == agent_id for kv in kvs):
            post(news.ShutdownAsked(RETIRED))

    def ended_resync(kvs: Sequence[KeyValue]) -> None:
        if any(kv.key == keys.ended for kv in kvs):
            post(news.Ended())

    feeds: list[tuple[str, Callable[[Event], None], Callable[[Sequence[KeyValue]], None]]] = [
        (
            keys.assignments(host),
            lambda e: post(news.Assigned(e.key, e.value if e.type == PUT else None)),
            lambda kvs: post(news.AssignedAll(list(kvs))),
        ),
        (leader_key, leader_event, leader_resync),
        (
            keys.plan_host_prefix(host),
            lambda e: parts.seen(e.key, e.value if e.type == PUT else None),
            lambda kvs: parts.reset({kv.key: kv.value for kv in kvs}),
        ),
        (
            keys.plan_head,
            lambda e: round_read(e.value) if e.type == PUT and e.key == keys.plan_head else None,
            round_resync,
        ),
        (
            keys.ended,
            lambda e: post(news.Ended()) if e.type == PUT and e.key == keys.ended else None,
            ended_resync,
        ),
    ]
    if identity.agent_id:  # an agent with no id cannot be named, so is never retired
        feeds.append((retire_key, retire_event, retire_resync))
    for prefix, on_event, on_resync in feeds:
        follow_in_thread(
            f"agent-watch-{prefix}",
            store,
            prefix,
            on_event=on_event,
            on_resync=on_resync,
            on_lost=lambda exc: post(news.LeaderSeen(None)),
            stop=stop,
            patience=patience,
            clock=clock,
        )
