"""A worker's life cycle (``driver.policy.lifecycle``): the states a record moves
through, and which of them count as running, active or live."""

from __future__ import annotations

import pytest

from driver.policy import lifecycle, rounds
from driver.policy.lifecycle import WorkerRecord
from tests.driver.policy.builders import S, info, rec, table

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


# ----------------------------------------------------------------------------- states


def test_registration_moves_a_worker_in_and_out_of_the_candidates():
    r = WorkerRecord.launched("w", "h", 0, now=1.0)
    assert r.state is S.LAUNCHED and r.since == 1.0 and not r.live
    r = lifecycle.registered(r, info("w"), created_revision=7, now=2.0)
    assert r.state is S.REGISTERED and r.live and r.registered_seq == 7 and r.since == 2.0
    same = lifecycle.registered(r, info("w"), created_revision=7, now=3.0)  # a lease refresh
    assert same.state is S.REGISTERED and same.since == 2.0
    lapsed = lifecycle.unregistered(r, now=4.0)
    assert lapsed.state is S.UNREGISTERED and lapsed.info is None and lapsed.since == 4.0
    back = lifecycle.registered(lapsed, info("w"), created_revision=9, now=5.0)
    assert back.state is S.REGISTERED and back.registered_seq == 9  # registered anew: later
    going = lifecycle.stopping(back, now=6.0)
    assert lifecycle.registered(going, info("w"), 9, 7.0).state is S.STOPPING
    assert lifecycle.unregistered(going, 7.0).state is S.STOPPING


@pytest.mark.parametrize(
    "before, code, after",
    [
        (S.REGISTERED, 0, S.FINISHED),
        (S.REGISTERED, 3, S.FAILED),
        (S.LAUNCHED, -9, S.FAILED),
        (S.STOPPING, 0, S.STOPPED),
        (S.STOPPING, -15, S.STOPPED),
        (S.KILLED, -9, S.FAILED),
        (S.CHAOS_KILLED, -9, S.FAILED),
        (S.UNREGISTERED, 1, S.FAILED),
    ],
)
def test_exit_states(before, code, after):
    done = lifecycle.exited(rec("w", state=before), code, now=5.0)
    assert done.state is after and done.exit_code == code and done.info is None
    assert not done.state.running and not done.state.active


def test_running_and_active_states():
    assert {s for s in S if s.active} == {S.LAUNCHED, S.REGISTERED, S.UNREGISTERED}
    assert {s for s in S if not s.running} == {S.FINISHED, S.FAILED, S.STOPPED}
    assert lifecycle.killed(rec("w"), 1.0).state is S.KILLED
    assert lifecycle.killed(rec("w"), 1.0, chaos=True).state is S.CHAOS_KILLED


def test_live_infos_in_registration_order():
    t = table(
        rec("a", 0, seq=5),
        rec("b", 1, seq=2),
        rec("c", 2, state=S.STOPPING),
        rec("d", 3, state=S.LAUNCHED),
    )
    assert [i.worker_id for i in rounds.live_infos(t)] == ["b", "a"]
