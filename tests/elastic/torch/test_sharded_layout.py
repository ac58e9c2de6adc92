"""The sharded sync's decisions (``elastic.torch.sharded.layout``): pure functions."""

from __future__ import annotations

import pytest

from elastic.torch.sharded.layout import Choice, Holding, Lost, choose, mirror_holder

OLD = "1/4"


def survivor(rank: int, own: tuple[int, ...], mirrored=()) -> Holding:
    return Holding(OLD, 4, rank, own, tuple(mirrored))


@pytest.mark.timeout(5)
def test_the_first_sync_of_a_job_is_in_place():
    holdings = [survivor(r, (0,)) for r in range(4)]
    choice = choose(holdings, OLD)
    assert choice == Choice(OLD, 4, 0, (0, 1, 2, 3), 0, in_place=True)


@pytest.mark.timeout(5)
def test_a_lost_part_comes_from_its_mirror():
    # rank 1 is lost; rank 2 (now new rank 1) mirrors it
    holdings = [
        survivor(0, (4, 5), [(OLD, 3, 4), (OLD, 3, 5)]),
        survivor(2, (4, 5), [(OLD, 1, 4), (OLD, 1, 5)]),
        survivor(3, (4, 5), [(OLD, 2, 4), (OLD, 2, 5)]),
    ]
    choice = choose(holdings, "2/3")
    assert isinstance(choice, Choice) and not choice.in_place
    assert (choice.commit, choice.senders, choice.root) == (5, (0, 1, 1, 2), 0)


@pytest.mark.timeout(5)
def test_the_newest_commit_every_part_of_which_is_held_wins():
    # the lost rank's mirror has only commit 4 (its send of 5 did not end)
    holdings = [
        survivor(0, (4, 5), [(OLD, 3, 4), (OLD, 3, 5)]),
        survivor(2, (4, 5), [(OLD, 1, 4)]),
        survivor(3, (4, 5), [(OLD, 2, 4), (OLD, 2, 5)]),
    ]
    choice = choose(holdings, "2/3")
    assert isinstance(choice, Choice) and choice.commit == 4


@pytest.mark.timeout(5)
def test_a_part_lost_with_its_mirror_is_lost_naming_the_step():
    holdings = [survivor(0, (6, 7)), survivor(2, (6, 7)), survivor(3, (6, 7))]
    assert choose(holdings, "2/3") == Lost(7, (1,))


@pytest.mark.timeout(5)
def test_a_newcomer_holding_a_fresh_cut_takes_the_survivors_commit():
    holdings = [
        Holding("2/3", 3, 0, (11, 12), (("2/3", 2, 12),)),
        Holding("2/3", 3, 1, (11, 12), (("2/3", 0, 12),)),
        Holding("2/3", 3, 2, (11, 12), (("2/3", 1, 12),)),
        Holding("3/4", 4, 3, (0,)),
    ]
    choice = choose(holdings, "3/4")
    assert isinstance(choice, Choice)
    assert (choice.layout, choice.commit, choice.senders) == ("2/3", 12, (0, 1, 2))


@pytest.mark.timeout(5)
def test_the_mirror_is_the_next_rank_on_another_host():
    assert mirror_holder(0, ["a", "a", "b", "b"]) == 2
    assert mirror_holder(3, ["a", "a", "b", "b"]) == 0
    assert mirror_holder(1, ["a", "a", "a"]) == 2  # one host: the next rank
    assert mirror_holder(0, ["a"]) is None
