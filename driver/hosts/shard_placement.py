"""Where the ps shards run (``--ps-placement``), and where one moves when its host is lost.

* ``driver`` (the default): every shard on the driver's machine, as ``localhost``;
* ``spread``: shard ``i`` on the ``i``-th usable host (round robin). A shard restarts on
  its host while that host is usable; when the host is lost (its agent stopped
  answering, or it was blacklisted) the shard restarts on another usable host. It loads
  the newest complete checkpoint there, so ``--ps-checkpoint-dir`` must be storage every
  host sees (a shared file system). A shard's backup (``--ps-replicas 1``) runs on
  another usable host than the shard, the one after it in the job's order, so that one
  lost host never takes both; with one usable host, beside the shard.

``spread_host`` and ``backup_host`` are the rules (pure); ``ShardPlacement`` gives the
supervisor the host and the command line of each start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

PLACEMENTS = ("driver", "spread")
DRIVER_HOST = "localhost"


def spread_host(index: int, previous: str | None, usable: Sequence[str]) -> str:
    """The host for shard ``index``: its ``previous`` host while usable, else the
    ``index``-th usable host (round robin); the driver's machine when none is usable."""
    if previous is not None and previous in usable:
        return previous
    if not usable:
        return DRIVER_HOST
    return usable[index % len(usable)]


def backup_host(index: int, primary: str, previous: str | None, usable: Sequence[str]) -> str:
    """The host for the backup of shard ``index`` whose primary runs on ``primary``: its
    ``previous`` host while usable and not the primary's, else the usable host after
    the primary's (round robin); the primary's own host when no other is usable."""
    others = [h for h in usable if h != primary]
    if previous is not None and previous in others:
        return previous
    if not others:
        return primary
    if primary in usable:
        return usable[(list(usable).index(primary) + 1) % len(usable)]
    return others[index % len(others)]


class ShardPlacement:
    """Hosts and command lines of the shards. ``usable()``: the hosts a shard may run
    on now, in the job's order (None: the driver's machine only); ``command(index,
    host)``: shard ``index``'s command line on ``host``."""

    def __init__(
        self,
        command: Callable[[int, str], tuple[str, ...]],
        usable: Callable[[], Sequence[str]] | None = None,
    ):
        self._command = command
        self._usable = usable

    def host_for(self, index: int, previous: str | None) -> str:
        if self._usable is None:
            return DRIVER_HOST
        return spread_host(index, previous, self._usable())

    def backup_host_for(self, index: int, primary: str, previous: str | None) -> str:
        if self._usable is None:
            return DRIVER_HOST
        return backup_host(index, primary, previous, self._usable())

    def command_for(self, index: int, host: str) -> tuple[str, ...]:
        return self._command(index, host)
