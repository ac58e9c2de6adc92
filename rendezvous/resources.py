"""What a serving process keeps for itself whatever its peers do: file descriptors and
memory (the one place for these process-wide limits; the gRPC servers' own caps are
``rendezvous.net.rpc.ServerLimits``, the ps bulk port's ``ps.settings.BulkLimits``).

Descriptors. Every connection a server holds is a descriptor, and so is everything the
process must still do: a driver starting a worker needs pipes, a shard writing a
checkpoint needs a file. So ``raise_fd_limit`` raises the soft ``RLIMIT_NOFILE`` to the
hard limit at the start of the driver, the shards and the standalone store (a soft
limit of 1024 is common and is far below what the kernel allows), and
``connection_cap`` gives one server at most ``CONNECTION_SHARE`` of the limit: a flood
of connections is refused at the door while the rest stays free for the job.

Memory. Calls refused by thousands are freed when they end, but glibc keeps the freed
pages (in many arenas: gRPC's threads each have one) and the process stays at its peak.
``release_free_memory`` hands them back (``malloc_trim``); servers call it once a flood
of refusals is over, not on a timer (a shard keeps large freed buffers on purpose:
``ps.memory``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import resource

log = logging.getLogger(__name__)

#: the soft limit is raised no higher than this: children inherit it, and some programs
#: still walk every possible descriptor (closing them one by one) at start
FD_CEILING = 1 << 16
#: the share of the descriptor limit one server's connections may take
CONNECTION_SHARE = 0.5


def fd_limit() -> int:
    """The process's soft limit on open descriptors (``FD_CEILING`` when unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return FD_CEILING if soft == resource.RLIM_INFINITY else soft


def raise_fd_limit(ceiling: int = FD_CEILING) -> int:
    """Raise the soft descriptor limit to the hard limit (up to ``ceiling``); never
    lowers it. Returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as exc:  # a platform that refuses: keep the soft one
            log.debug("cannot raise the descriptor limit to %d: %s", want, exc)
    return fd_limit()


def connection_cap(wanted: int) -> int:
    """How many connections one server may hold: ``wanted``, and no more than
    ``CONNECTION_SHARE`` of the descriptor limit now in force, so that a flood of
    connections leaves the rest of the process its descriptors."""
    return max(1, min(wanted, int(fd_limit() * CONNECTION_SHARE)))


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The C library (for glibc's allocator controls), or None where there is none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release_free_memory() -> bool:
    """Hand the memory the allocator holds free back to the system (glibc's
    ``malloc_trim(0)``: every arena, and free pages inside the heap too). False where
    there is no glibc: the memory is then reused, not returned."""
    c = libc()
    trim = getattr(c, "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True
