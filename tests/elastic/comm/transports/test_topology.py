"""Pure logic of the transport agreement: offers on the wire, which members share a
host, the plan every rule gives, and how arrays are cut into pieces."""

from __future__ import annotations

import pytest

from elastic.comm import layout
from elastic.comm.base import TRANSPORTS
from elastic.comm.transports.topology import HostId, Offer, choose, host_groups

pytestmark = pytest.mark.unit  # pure logic: no process, no socket

BOOT = "0e7c5a7e-1f7b-4d4e-9a43-6f1e2a3b4c5d"
PIECE = 4 << 20


def host(name: str, device: int = 40, boot: str = BOOT) -> HostId:
    return HostId(boot, name, device)


def offers(*places: str, rule: str = "auto", segment: bytes = b"seg", piece: int = PIECE):
    return [Offer(rule, host(p), piece, segment) for p in places]


def test_offer_roundtrip_and_bad_blobs():
    for rule in TRANSPORTS:
        mine = Offer(rule, host("h1-7", 123456), PIECE, b"\x01" * 32)
        assert Offer.decode(mine.encode()) == mine
    assert Offer.decode(Offer("tcp", host("n"), PIECE).encode()).segment == b""
    with pytest.raises(ValueError):
        Offer.decode(b"short")
    bad_rule = bytes([len(TRANSPORTS)]) + Offer("auto", host("n"), PIECE).encode()[1:]
    with pytest.raises(ValueError, match="unknown transport rule"):
        Offer.decode(bad_rule)


def test_hosts_differ_by_boot_name_or_shm_device():
    # The test hosts share a kernel (one boot id): the name and the private /dev/shm
    # keep them apart, and a member without a segment or boot id is alone.
    same = [Offer("auto", host("a"), PIECE, b"s"), Offer("auto", host("a"), PIECE, b"s")]
    assert host_groups(same) == ((0, 1),)
    assert host_groups(same + [Offer("auto", host("a", device=41), PIECE, b"s")]) == (
        (0, 1),
        (2,),
    )
    assert host_groups(same + [Offer("auto", host("a", boot="other"), PIECE, b"s")]) == (
        (0, 1),
        (2,),
    )
    assert host_groups(same + [Offer("auto", host("a"), PIECE, b"")]) == ((0, 1), (2,))
    assert host_groups(same + [Offer("auto", host("a", boot=""), PIECE, b"s")]) == ((0, 1), (2,))


@pytest.mark.parametrize(
    "places,kind",
    [
        (("a", "a", "a"), "shm"),  # all on one host: shared memory, as before
        (("a", "b", "c"), "tcp"),  # one member per host: the TCP ring
        (("a", "a", "b", "b"), "hier"),  # several hosts, some shared
        (("a", "b", "a"), "hier"),
    ],
)
def test_auto_follows_the_placement(places, kind):
    assert choose(offers(*places)).kind == kind


def test_groups_are_in_rank_order_with_the_leader_first():
    plan = choose(offers("a", "b", "c", "a", "c"))
    assert plan.kind == "hier" and plan.groups == ((0, 3), (1,), (2, 4))
    assert [plan.group_of(r) for r in range(5)] == [0, 1, 2, 0, 2]


def test_rules_agree_when_members_were_given_different_ones():
    mixed = offers("a", "a", "b", "b")
    mixed[1] = Offer("tcp", host("a"), PIECE)  # no segment
    assert choose(mixed).kind == "tcp"
    mixed = offers("a", "a", "b", "b")
    mixed[2] = Offer("shm", host("b"), PIECE, b"s")
    assert choose(mixed).kind == "tcp"  # shm across hosts: impossible (its member fails)
    assert choose(offers("a", "a", rule="shm")).kind == "shm"
    mixed = offers("a", "a", "b")
    mixed[0] = Offer("hier", host("a"), PIECE, b"s")
    assert choose(mixed).kind == "hier"
    # "hier" holds even where "auto" would pick something else.
    assert choose(offers("a", "a", rule="hier")).kind == "hier"
    assert choose(offers("a", "b", rule="hier")).groups == ((0,), (1,))


def test_auto_needs_every_segment_and_hier_the_same_pieces():
    missing = offers("a", "a", "a")
    missing[2] = Offer("auto", host("a"), PIECE)
    assert choose(missing).kind == "tcp"  # as before: shared memory needs everyone
    uneven = offers("a", "a", "b", "b")
    uneven[3] = Offer("auto", host("b"), PIECE * 2, b"s")
    assert choose(uneven).kind == "tcp"
    uneven = [Offer("hier", o.host, o.piece_bytes, o.segment) for o in uneven]
    assert choose(uneven).kind == "tcp"


def test_pieces_cover_the_array_and_an_empty_one_has_one():
    assert layout.pieces(0, 4096, 4) == [(0, 0)]
    assert layout.pieces(10, 16, 4) == [(0, 4), (4, 8), (8, 10)]
    assert layout.pieces(3, 4096, 8) == [(0, 3)]
    assert layout.pieces(5, 2, 8) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
