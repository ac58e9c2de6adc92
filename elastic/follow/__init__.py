"""How a worker registers in its job and learns its rounds: a ``RoundFeed``, picked by
name (``feed_name``), so the runtime (``elastic.runtime``) does not care which.

* ``"store"`` (``elastic.follow.store``): the worker is the store's client itself: its
  own lease, its registration under it, its own watch of the round's head. What a job
  without agents does (a single-host job on the default launcher, no etcd).
* ``"agent"`` (``elastic.follow.agent``): the worker's agent is the store's client for
  it (``rendezvous.host_channel``): the worker registers and learns its rounds over the
  agent's Unix socket, and the store holds one lease and one watch per host.

Either way the feed calls ``on_round`` with each round newer than ``newest()`` that
this host reads (``rendezvous.host_plan.RoundView``), from a thread of its own, and the
registration is the same record under the same key (``JobKeys.worker``).
"""

from __future__ import annotations

from elastic.follow.agent import AgentFeed
from elastic.follow.base import FeedHooks, FeedSettings, RoundFeed
from elastic.follow.store import StoreFeed
from elastic.rounds import RoundReader
from rendezvous.errors import RendezvousConfigError
from rendezvous.keys import JobKeys
from rendezvous.store import KVStore

FEEDS = ("store", "agent")

__all__ = ["FEEDS", "FeedHooks", "FeedSettings", "RoundFeed", "feed_name", "open_feed"]


def feed_name(settings: FeedSettings) -> str:
    """The feed of a worker: through its agent when it was given the agent's socket."""
    return "agent" if settings.agent_socket else "store"


def open_feed(
    name: str,
    settings: FeedSettings,
    hooks: FeedHooks,
    *,
    store: KVStore,
    keys: JobKeys,
    rounds: RoundReader,
) -> RoundFeed:
    """The feed called ``name`` (one of ``FEEDS``). ``rounds`` reads this host's rounds
    from ``store``; ``hooks`` are what the feed calls back into the worker with (see
    ``FeedHooks``).

    Raises:
        RendezvousConfigError: no feed of that name."""
    if name == "store":
        return StoreFeed(settings, store, keys, rounds, hooks)
    if name == "agent":
        return AgentFeed(settings, hooks)
    raise RendezvousConfigError(f"no round feed called {name!r}: use one of {FEEDS}")
