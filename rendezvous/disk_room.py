"""Room on a full disk for a new ps checkpoint or snapshot: the oldest of a writer's own
deleted until the file system has the space the next one takes. Shared by the ps
shards' checkpoints (``ps.shard.checkpoint``) and the workers' snapshots
(``elastic.snapshots.files``): each decides which folders may go, oldest first (never
the newest complete one), and this deletes no more of them than it must.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

log = logging.getLogger(__name__)

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The errors of a disk (or a quota) that is full: room can be made by deleting."""

T = TypeVar("T")


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` is a write refused for want of space (a full disk or quota)."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE


def free_bytes(path: str) -> int:
    """Bytes this user may still write on the file system of ``path``.

    Raises:
        OSError: the file system cannot be measured."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def make_room(
    root: str, victims: Sequence[T], needed: float, delete: Callable[[T], None]
) -> list[T]:
    """Delete ``victims`` in their order (the caller's choice, oldest first) until the
    file system of ``root`` has ``needed`` bytes free; the victims deleted. Best effort:
    a file system that cannot be measured is left as it is (the write that follows
    then says what is wrong)."""
    deleted: list[T] = []
    try:
        for victim in victims:
            if free_bytes(root) >= needed:
                break
            delete(victim)
            deleted.append(victim)
    except OSError as exc:
        log.warning("cannot make room in %s: %s", root, exc)
    return deleted
