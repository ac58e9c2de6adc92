"""How long the store has been away, as one process's looks found it (pure: a fake
clock)."""

from __future__ import annotations

import pytest

from rendezvous.errors import RendezvousConnectionError
from rendezvous.store_reach import StoreReach


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_look_answered_in_time_is_no_trouble():
    clock = Clock()
    reach = StoreReach(clock, slow=1.0)
    reach.asking()
    clock.now = 0.5
    reach.answered(True)
    assert reach.away_for() == 0.0 and reach.latest() is None


def test_failed_looks_count_from_the_first_until_an_answer():
    clock = Clock()
    reach = StoreReach(clock, slow=1.0)
    clock.now = 10.0
    reach.asking()
    clock.now = 12.0
    reach.answered(False)
    clock.now = 13.0
    reach.asking()
    clock.now = 15.0
    reach.answered(False)
    assert reach.away_for() == 5.0 and reach.latest() == 15.0
    reach.asking()
    clock.now = 17.0
    reach.answered(True)  # late: trouble at 17, but the store is back
    assert reach.away_for() == 0.0 and reach.latest() == 17.0


def test_a_look_still_waiting_past_the_slow_bound_is_an_outage_going_on():
    clock = Clock()
    reach = StoreReach(clock, slow=1.0)
    clock.now = 5.0
    reach.asking()  # (a stalled etcd holds the call)
    clock.now = 5.9
    assert reach.away_for() == 0.0 and reach.latest() is None
    clock.now = 9.0
    assert reach.away_for() == 4.0 and reach.latest() == 9.0


def test_looking_notes_a_store_error_and_lets_it_through():
    clock = Clock()
    reach = StoreReach(clock, slow=1.0)
    with pytest.raises(RendezvousConnectionError), reach.looking():
        clock.now = 2.0
        raise RendezvousConnectionError("refused")
    clock.now = 4.0
    assert reach.away_for() == 4.0
    with reach.looking():
        clock.now = 4.1
    assert reach.away_for() == 0.0
