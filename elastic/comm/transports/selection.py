"""Which transport a round's collectives use, agreed by every member during setup.

``CommSettings.transport`` names the rule:

* "tcp": the TCP ring the communicator has already connected;
* "auto": shared memory when every member is on this host; the TCP ring when no two
  members share a host; otherwise hierarchical (shared memory inside each host, a TCP
  ring among one leader per host: ``hier.py``);
* "shm": shared memory, or ``ShmUnavailableError``;
* "hier": hierarchical whatever the placement, or ``ShmUnavailableError`` when the
  members of a host cannot share memory.

Every member must end up with the same transport, so the decision is taken from what
all members said in ``exchange`` rounds, never from local facts alone. First each member
offers its rule, its machine's identity and a shared-memory segment (``topology.Offer``;
a member asked for "tcp" offers no segment but still takes part, so members given
different rules agree too), and every member computes the same plan from the offers
(``topology.choose``). Then each member maps the segments of the members its plan puts
on its host (and leaders connect to each other), and says whether that worked: the plan
is used only when it worked everywhere, which proves that members grouped as one host
really share memory (the test hosts share a kernel and a boot id; their private
/dev/shm and PID namespaces keep them apart). Otherwise "auto" falls back to the TCP
ring. Setup ends with an exchange, so with a barrier, either way.

A new transport is one more rule here (and its name in ``base.TRANSPORTS``): an opener
in ``OPENERS`` with an agreement that every other opener follows too.
"""

from __future__ import annotations

import logging
from typing import Callable

from elastic.comm.transports import cpus as host_cpus
from elastic.comm.transports import shm, topology
from elastic.comm.transports.base import Mismatch, Transport, TransportContext
from elastic.comm.transports.hier import HierParts, HierTransport, LeaderLinks
from elastic.comm.transports.host_group import HostGroup
from elastic.comm.transports.topology import Offer, Plan
from elastic.errors import ShmUnavailableError

log = logging.getLogger(__name__)


def _open_agreed(ctx: TransportContext) -> Transport:
    """The transport every member agrees on (see the module docstring).

    Raises:
        ShmUnavailableError: "shm" or "hier" was required and the members cannot share
            memory as it needs.
        TimeoutError: a member did not answer before ``ctx.deadline``.
        PeerLostError: a host leader did not connect before ``ctx.deadline``.
        Interrupted, Mismatch, PeerGone: from ``ctx.exchange``.
    """
    settings = ctx.settings
    seg = None
    if settings.transport != "tcp" and shm.shm_supported():
        try:
            seg = shm.ShmSegment(settings.shm_piece_bytes)
        except OSError as e:
            log.info("no shared-memory segment (%s); using TCP", e)
    candidate: Transport | None = None
    agreed = False
    try:
        mine = Offer(
            settings.transport,
            topology.HostId.here(),
            settings.shm_piece_bytes,
            seg.info() if seg else b"",
        )
        offers = _decode(ctx.exchange(mine.encode()))
        plan = topology.choose(offers)
        why = f"members asked for {sorted({o.rule for o in offers})}"
        if plan.kind != "tcp":
            candidate = _build(ctx, plan, offers, seg)
            oks = ctx.exchange(b"\x01" if candidate is not None else b"\x00")
            agreed = candidate is not None and all(b == b"\x01" for b in oks)
            if agreed:
                assert candidate is not None
                return candidate
            why = "the members of a host could not map each other's shared memory"
        if settings.transport in ("shm", "hier"):
            raise ShmUnavailableError(
                f"transport={settings.transport!r} but the members cannot share memory "
                f"({why}; {len(topology.host_groups(offers))} host(s), shared memory "
                f"supported here: {shm.shm_supported()})"
            )
        return ctx.ring
    finally:
        if seg is not None:
            seg.close_fd()  # every peer has mapped it (or will not)
        if not agreed:
            if candidate is not None:
                candidate.close()  # unmaps every segment, this member's too
            if seg is not None:
                seg.mm.close()  # idempotent


def _decode(blobs: list[bytes]) -> list[Offer]:
    offers = []
    for rank, blob in enumerate(blobs):
        try:
            offers.append(Offer.decode(blob))
        except ValueError as e:
            raise Mismatch(f"rank {rank} sent a bad transport offer: {e}") from None
    return offers


def leader_overlaps(setting: bool | None, host_members: int, cpus: int) -> bool:
    """Whether a host leader runs its network steps on a thread of its own: as
    ``setting`` says, or, when it is None, if its host of ``host_members`` has a CPU
    for that thread besides one per member (of ``cpus``)."""
    return setting if setting is not None else host_members + 1 <= cpus


def _build(
    ctx: TransportContext, plan: Plan, offers: list[Offer], seg: shm.ShmSegment | None
) -> Transport | None:
    """This member's side of ``plan``, or None when it cannot map its host's segments.
    A leader connects to the other leaders even then, so that none waits for it. (A
    member without a segment is alone on its host in every plan with shared memory.)

    Raises:
        PeerLostError: a host leader did not connect in time.
        whatever ``ctx.dial``, ``ctx.claim`` and ``ctx.check`` raise.
    """
    members = plan.groups[plan.group_of(ctx.rank)]
    infos = [offers[m].segment for m in members]
    settings = ctx.settings
    cpus = host_cpus.usable_cpus()
    overlap = leader_overlaps(settings.leader_overlap, len(members), cpus)
    spin = settings.shm_spin_us
    if spin is None:
        # Across hosts, the leader's network step keeps a CPU busy besides the members
        # (its thread, or its kernel copies while its main thread waits in them), and
        # the members' waits are mostly for that step: milliseconds, not a spin's worth.
        network = plan.kind != "shm" and len(plan.groups) > 1
        spin = shm.default_spin_us(len(members) + network, cpus)
    if plan.kind == "shm":
        assert seg is not None
        try:
            return shm.ShmGroup(ctx.rank, ctx.size, seg, infos, spin, ctx.check)
        except OSError as e:
            log.info("cannot map the peers' shared memory (%s); using TCP", e)
            return None
    host = None
    mapped = True
    if len(members) > 1:
        assert seg is not None
        try:
            host = HostGroup(members, ctx.rank, seg, infos, spin, ctx.check)
        except OSError as e:
            log.info("cannot map shared memory on host of rank %d (%s)", ctx.rank, e)
            mapped = False
    elif seg is not None:
        seg.mm.close()  # alone on its host: nobody maps it
    leaders = None
    try:
        if members[0] == ctx.rank and len(plan.groups) > 1:
            leaders = LeaderLinks(
                ctx.rank,
                [g[0] for g in plan.groups],
                ctx.dial,
                ctx.claim,
                settings.connect_timeout,
                ctx.check,
            )
    except BaseException:
        if host is not None:
            host.close()
        raise
    parts = HierParts(host, leaders, overlap)
    transport = HierTransport(ctx.rank, ctx.size, plan, parts, settings, ctx.check)
    if mapped:
        return transport
    transport.close()
    return None


# Every rule follows the same agreement (see above), so members given different rules
# still agree on one transport.
OPENERS: dict[str, Callable[[TransportContext], Transport]] = {
    "tcp": _open_agreed,
    "auto": _open_agreed,
    "shm": _open_agreed,
    "hier": _open_agreed,
}


def open_transport(ctx: TransportContext) -> Transport:
    """The transport every member of the round agreed on under ``ctx.settings.transport``.

    Raises:
        ShmUnavailableError: "shm" or "hier" was required and is impossible.
        TimeoutError: a member did not answer before ``ctx.deadline``.
        PeerLostError: a host leader did not connect before ``ctx.deadline``.
        Interrupted, Mismatch, PeerGone: the setup exchange failed.
    """
    return OPENERS[ctx.settings.transport](ctx)
