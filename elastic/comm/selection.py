"""Which transport a round's collectives use, agreed by every member during setup.

``CommSettings.transport`` names the rule, and each rule is one opener here:

* "tcp": the TCP ring the communicator has already connected (such a member offers no
  segment but still takes part in the agreement);
* "auto": shared memory when every member can map every other member's segment (all
  on this host, under the same kernel boot, on a platform ``shm`` supports), else the
  TCP ring;
* "shm": shared memory, or ``ShmUnavailableError``.

Every member must end up with the same transport, so the decision is taken from what
all members said in ``exchange`` rounds, never from local facts alone: first each
member offers a segment (or nothing), then each says whether it could map all of them.
A new transport is one more opener in ``OPENERS`` (and its name in ``base.TRANSPORTS``).
"""

from __future__ import annotations

import logging
from typing import Callable

from . import shm
from .base import ShmUnavailableError
from .transport import Transport, TransportContext

log = logging.getLogger(__name__)


def _open_ring_or_shared_memory(ctx: TransportContext) -> Transport:
    """Shared memory when every member agrees it works, else the TCP ring.

    Members asked for "tcp" offer no segment but still take part in the agreement, so
    members with different settings agree too, and setup ends with a barrier either way.

    Raises:
        ShmUnavailableError: "shm" was required and the members cannot share memory.
        TimeoutError: a member did not answer before ``ctx.deadline``.
        Interrupted, Mismatch, PeerGone: from ``ctx.exchange``.
    """
    settings = ctx.settings
    seg = None
    group = None
    agreed = False
    if settings.transport != "tcp" and shm.shm_supported():
        try:
            seg = shm.ShmSegment(settings.shm_piece_bytes)
        except OSError as e:
            log.info("no shared-memory segment (%s); using TCP", e)
    try:
        infos = ctx.exchange(seg.info() if seg else b"")
        if shm.same_host(infos) and seg is not None:
            spin = (
                settings.shm_spin_us
                if settings.shm_spin_us is not None
                else shm.default_spin_us(ctx.size)
            )
            try:
                group = shm.ShmGroup(ctx.rank, ctx.size, seg, infos, spin, ctx.check)
            except OSError as e:
                log.info("cannot map the peers' shared memory (%s); using TCP", e)
            oks = ctx.exchange(b"\x01" if group else b"\x00")
            agreed = group is not None and all(b == b"\x01" for b in oks)
        if agreed:
            assert group is not None
            return group
        if settings.transport == "shm":
            raise ShmUnavailableError(
                "transport='shm' but the members cannot share memory "
                f"(same host: {shm.same_host(infos)}, supported: {shm.shm_supported()})"
            )
        return ctx.ring
    finally:
        if seg is not None:
            seg.close_fd()  # every peer has mapped it (or will not)
        if not agreed:
            if group is not None:
                group.close()  # unmaps every segment, this rank's too
            if seg is not None:
                seg.mm.close()  # idempotent


# The three rules share one agreement (see above); a transport with its own agreement
# (e.g. hierarchical: shared memory inside each host, a TCP ring among host leaders)
# gets an opener of its own.
OPENERS: dict[str, Callable[[TransportContext], Transport]] = {
    "tcp": _open_ring_or_shared_memory,
    "auto": _open_ring_or_shared_memory,
    "shm": _open_ring_or_shared_memory,
}


def open_transport(ctx: TransportContext) -> Transport:
    """The transport every member of the round agreed on under ``ctx.settings.transport``.

    Raises:
        ShmUnavailableError: "shm" was required and is impossible.
        TimeoutError: a member did not answer before ``ctx.deadline``.
        Interrupted, Mismatch, PeerGone: the setup exchange failed.
    """
    return OPENERS[ctx.settings.transport](ctx)
