"""Which members of a round share a machine, and which transport that placement calls
for: pure decisions over what every member offered in the setup exchange.

Each member offers its ``Offer``: the rule it was given (``CommSettings.transport``), the
identity of the machine it runs on (``HostId``) and its shared-memory segment (or none).
Every member decides from the same list of offers, so all decide alike; ``selection.py``
carries the offers and then checks the decision (every member of a host group must map
its peers' segments before the group is used).

A ``HostId`` is what tells machines apart, from facts that differ between machines even
when they share a kernel (containers, and the test hosts, which are network, UTS, PID and
mount namespaces of one kernel): the kernel's boot id (differs between real machines),
the UTS host name, and the device of the ``/dev/shm`` this process sees (a private tmpfs
per container or test host has a device of its own). Two members share a host only when
all three agree; the segment mapping then proves it.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

from elastic.comm.base import TRANSPORTS

SHM_DIR = "/dev/shm"

# rule index, boot id, /dev/shm device, piece bytes, host name length
_OFFER_HEAD = struct.Struct("!B36sQQH")


@dataclass(frozen=True)
class HostId:
    """The identity of the machine a member runs on (see the module docstring)."""

    boot_id: str
    hostname: str
    shm_device: int

    @classmethod
    def here(cls) -> HostId:
        """This process's machine."""
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot = f.read().strip()[:36]
        except OSError:
            boot = ""
        try:
            device = os.stat(SHM_DIR).st_dev
        except OSError:
            device = 0
        return cls(boot, socket.gethostname(), device)

    @property
    def known(self) -> bool:
        """False when the machine cannot be told apart from others (no boot id)."""
        return bool(self.boot_id)


@dataclass(frozen=True)
class Offer:
    """What one member says in the setup exchange: its ``rule`` (one of
    ``base.TRANSPORTS``), its ``host``, its ``CommSettings.shm_piece_bytes`` and its
    segment's ``shm.ShmSegment.info()`` (empty when it offers none)."""

    rule: str
    host: HostId
    piece_bytes: int
    segment: bytes = b""

    def encode(self) -> bytes:
        name = self.host.hostname.encode()[:255]
        head = _OFFER_HEAD.pack(
            TRANSPORTS.index(self.rule),
            self.host.boot_id.encode(),
            self.host.shm_device,
            self.piece_bytes,
            len(name),
        )
        return head + name + self.segment

    @classmethod
    def decode(cls, blob: bytes) -> Offer:
        """Raises ValueError when ``blob`` is not an offer."""
        if len(blob) < _OFFER_HEAD.size:
            raise ValueError("short transport offer")
        rule, boot, device, piece_bytes, name_len = _OFFER_HEAD.unpack_from(blob)
        if rule >= len(TRANSPORTS):
            raise ValueError(f"unknown transport rule {rule} in an offer")
        end = _OFFER_HEAD.size + name_len
        boot_id = boot.rstrip(b"\x00").decode(errors="replace")
        host = HostId(boot_id, blob[_OFFER_HEAD.size : end].decode(errors="replace"), device)
        return cls(TRANSPORTS[rule], host, piece_bytes, bytes(blob[end:]))


@dataclass(frozen=True)
class Plan:
    """The transport every member uses: ``kind`` is "tcp", "shm" or "hier"; ``groups``
    are the members of each host in rank order, hosts ordered by their lowest rank (the
    first member of each group is its leader). A member that offers no segment, or whose
    machine is unknown, is a group of its own."""

    kind: str
    groups: tuple[tuple[int, ...], ...]

    def group_of(self, rank: int) -> int:
        """The index of the group ``rank`` belongs to."""
        return next(i for i, g in enumerate(self.groups) if rank in g)


def host_groups(offers: list[Offer]) -> tuple[tuple[int, ...], ...]:
    """The members of each host, as ``Plan.groups`` describes them."""
    groups: dict[object, list[int]] = {}
    for rank, offer in enumerate(offers):
        shareable = offer.segment and offer.host.known
        groups.setdefault(offer.host if shareable else ("alone", rank), []).append(rank)
    return tuple(tuple(g) for g in groups.values())


def choose(offers: list[Offer]) -> Plan:
    """The plan for a round whose members offered ``offers`` (in rank order).

    Rules, strongest first (members given different rules still agree): any "tcp" gives
    the TCP ring; any "shm" gives shared memory when every member is on one host, else
    the TCP ring (a member that required "shm" then fails); any "hier" gives the
    hierarchical transport whatever the placement; all "auto" give the TCP ring when a
    member offers no segment, shared memory on one host, the TCP ring when no two members
    share a host, and the hierarchical transport otherwise. The hierarchical transport
    needs every member to cut arrays into the same pieces (``shm_piece_bytes``): the TCP
    ring instead when they differ (shared memory checks that itself, when it maps).
    """
    rules = {o.rule for o in offers}
    groups = host_groups(offers)
    alone = tuple((r,) for r in range(len(offers)))
    one_host = len(groups) == 1
    if "tcp" in rules:
        return Plan("tcp", alone)
    if "shm" in rules:
        return Plan("shm", groups) if one_host else Plan("tcp", alone)
    same_pieces = len({o.piece_bytes for o in offers}) == 1
    if "hier" in rules:
        return Plan("hier", groups) if same_pieces else Plan("tcp", alone)
    if not all(o.segment for o in offers):
        return Plan("tcp", alone)  # shared memory is not possible everywhere
    if one_host:
        return Plan("shm", groups)
    if len(groups) == len(offers) or not same_pieces:
        return Plan("tcp", alone)
    return Plan("hier", groups)
