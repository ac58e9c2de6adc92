"""The shard state machine in one process (threads stand in for concurrent requests):
async de-duplication, sync rounds/steps/generations, and the checkpoint gate."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ps.errors import (
    PSNotReadyError,
    PSProtocolError,
    PSRoundChangedError,
    PSShapeError,
    PSUninitializedError,
)
from ps.partition import Slice
from ps.protocol import APPLIED, PENDING, ROLLED_BACK, SUPERSEDED, UNKNOWN
from ps.shard.state import ShardState, initial_generation

pytestmark = pytest.mark.unit  # pure logic: no process, no socket

SGD = {"optimizer": "sgd", "lr": 1.0}
G0 = initial_generation(None)


def _state(mode="async", value=None):
    st = ShardState(0, 1, mode)
    st.load(None, None, G0)
    value = np.zeros(4) if value is None else value
    st.create([(Slice("w", 0, 0, len(value), value.shape, value.dtype.str), value)], SGD, 1.0)
    return st


def _w(st):
    _, [(_meta, a)] = st.pull(["w"])
    return a


def test_data_calls_wait_for_restore():
    st = ShardState(0, 1, "async")
    with pytest.raises(PSNotReadyError):
        st.describe()
    st.load(None, None, G0)
    assert st.describe().variables == ()


def test_an_async_push_of_a_round_the_job_left_is_refused_never_applied():
    """A worker left behind (its host cut off, then back) pushes for its old round:
    refused, while the job's own workers and clients outside rounds go on."""
    st = _state()
    assert st.push_async("a", 1, [("w", np.ones(4))], 1.0, round_id=3) == 1
    with pytest.raises(PSRoundChangedError, match=r"round 2 refused.*round 3"):
        st.push_async("stale", 1, [("w", np.ones(4))], 1.0, round_id=2)
    assert st.step == 1
    assert st.push_async("b", 1, [("w", np.ones(4))], 1.0, round_id=4) == 2
    assert st.push_async("tool", 1, [("w", np.ones(4))], 1.0) == 3  # no round: not fenced


def test_async_push_applies_and_dedupes_repeats():
    st = _state()
    assert st.push_async("c", 1, [("w", np.ones(4))], 1.0) == 1
    assert st.push_async("c", 1, [("w", np.ones(4))], 1.0) == 1  # a retried push
    assert st.push_async("d", 1, [("w", np.ones(4))], 1.0) == 2
    np.testing.assert_array_equal(_w(st), -2 * np.ones(4))


def test_create_keeps_existing_and_checks_shapes():
    st = _state(value=np.arange(4.0))
    assert st.create([(Slice("w", 0, 0, 4, (4,), "<f8"), np.zeros(4))], SGD, 1.0) == []
    np.testing.assert_array_equal(_w(st), np.arange(4.0))
    with pytest.raises(PSShapeError):
        st.create([(Slice("w", 0, 0, 5, (5,), "<f8"), np.zeros(5))], SGD, 1.0)
    with pytest.raises(PSUninitializedError):
        st.push_async("c", 1, [("nope", np.ones(4))], 1.0)
    with pytest.raises(PSShapeError):
        st.push_async("c", 1, [("w", np.ones(3))], 1.0)


def _sync_push(st, rnd, size, rank, step, grad, gen=G0, wait=5.0):
    return st.push_sync(rnd, size, rank, step, gen, [("w", np.full(4, float(grad)))], wait)


def test_sync_step_applies_rank_ordered_average_once_all_ranks_pushed():
    st = _state("sync")
    with ThreadPoolExecutor(3) as pool:
        futures = [
            pool.submit(_sync_push, st, 1, 3, r, 1, g) for r, g in ((2, 6.0), (0, 1.0), (1, 2.0))
        ]
        replies = [f.result(timeout=10) for f in futures]
    assert {r.status for r in replies} == {APPLIED} and st.step == 1
    np.testing.assert_allclose(_w(st), -3.0 * np.ones(4))


def test_sync_pending_then_wait_step():
    st = _state("sync")
    assert _sync_push(st, 1, 2, 0, 1, 1.0, wait=0.05).status == PENDING
    assert st.wait_step(1, 0, 1, G0, 0.05).status == PENDING
    assert _sync_push(st, 1, 2, 1, 1, 3.0).status == APPLIED
    assert st.wait_step(1, 0, 1, G0, 0.05).status == APPLIED
    assert _sync_push(st, 1, 2, 0, 1, 9.0).status == APPLIED  # a redo of an applied step
    np.testing.assert_allclose(_w(st), -2.0 * np.ones(4))


def test_newer_round_drops_incomplete_step_and_supersedes_old_waiters():
    st = _state("sync")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_sync_push, st, 1, 3, 0, 1, 1.0)
        assert _sync_push(st, 1, 3, 1, 1, 1.0, wait=0.05).status == PENDING
        # rank 2 died; the survivors redo step 1 in round 2 (size 2)
        assert _sync_push(st, 2, 2, 0, 1, 4.0, wait=0.05).status == PENDING
        assert waiting.result(timeout=10).status == SUPERSEDED
    assert _sync_push(st, 1, 3, 2, 1, 1.0).status == SUPERSEDED
    assert st.wait_step(1, 1, 1, G0, 0.05).status == SUPERSEDED
    assert _sync_push(st, 2, 2, 1, 1, 2.0).status == APPLIED
    np.testing.assert_allclose(_w(st), -3.0 * np.ones(4))  # only round 2's average


def test_sync_rejects_contradicting_round_sizes_and_ranks():
    st = _state("sync")
    _sync_push(st, 1, 2, 0, 1, 1.0, wait=0.01)
    with pytest.raises(PSProtocolError):
        _sync_push(st, 1, 3, 1, 1, 1.0)
    with pytest.raises(PSProtocolError):
        _sync_push(st, 1, 2, 2, 1, 1.0)


def test_generation_change_refuses_old_gradients_and_step_skew():
    st = _state("sync")
    assert _sync_push(st, 1, 1, 0, 1, 1.0).status == APPLIED
    assert _sync_push(st, 1, 1, 0, 5, 1.0).status == ROLLED_BACK  # client is ahead
    st.adopt_generation("c0-x")
    reply = _sync_push(st, 1, 1, 0, 2, 1.0)
    assert reply.status == ROLLED_BACK and reply.generation == "c0-x"
    assert _sync_push(st, 1, 1, 0, 2, 1.0, gen="c0-x").status == APPLIED


def test_wait_step_after_reload_is_unknown_or_rolled_back():
    st = _state("sync")
    _sync_push(st, 3, 2, 0, 1, 1.0, wait=0.01)
    fresh = _state("sync")  # a restarted shard: round unknown
    assert fresh.wait_step(3, 0, 1, G0, 0.01).status == UNKNOWN
    st.load(None, None, "c0-y")
    assert st.wait_step(3, 0, 1, G0, 0.01).status == ROLLED_BACK


def test_gate_blocks_applies_until_snapshot_and_align_lets_laggards_catch_up():
    st = _state()
    st.push_async("a", 1, [("w", np.ones(4))], 1.0)
    status = st.prepare(checkpoint_id=7, lease=30.0)
    assert status.step == 1 and status.loaded
    with pytest.raises(PSNotReadyError):
        st.push_async("a", 2, [("w", np.ones(4))], 0.05)
    # another shard is at step 2: one more push may pass, the next waits
    done = threading.Event()
    results = []

    def pusher(seq):
        results.append(st.push_async("a", seq, [("w", np.ones(4))], 10.0))
        done.set()

    t = threading.Thread(target=pusher, args=(2,))
    t.start()
    assert st.align(7, target=2, timeout=5.0, fast_forward=False) == 2
    t.join(timeout=10)
    assert results == [2]
    with pytest.raises(PSNotReadyError):
        st.push_async("a", 3, [("w", np.ones(4))], 0.05)
    snap = st.snapshot(7)
    assert snap.step == 2 and snap.dedup == {"a": 2}
    np.testing.assert_array_equal(snap.variables["w"].param, -2 * np.ones(4))
    assert st.push_async("a", 3, [("w", np.ones(4))], 1.0) == 3  # gate open again
    assert snap.variables["w"].param[0] == -2  # the snapshot is a copy
    assert st.at_checkpoint(7) is False


def test_align_fast_forward_and_abort_and_lease():
    st = _state()
    st.prepare(1, lease=30.0)
    assert st.align(1, target=3, timeout=0.05, fast_forward=False) == 0
    assert st.align(1, target=3, timeout=0.05, fast_forward=True) == 3
    st.abort(1)
    assert st.push_async("a", 1, [("w", np.ones(4))], 0.5) == 4
    with pytest.raises(PSProtocolError):
        st.snapshot(1)
    st.prepare(2, lease=0.2)  # the coordinator dies here: the lease reopens the gate
    assert st.push_async("a", 2, [("w", np.ones(4))], 5.0) == 5
    with pytest.raises(PSProtocolError):
        st.align(2, 9, 0.1, True)


def test_sync_apply_waits_for_the_gate():
    st = _state("sync")
    st.prepare(4, lease=30.0)
    assert _sync_push(st, 1, 1, 0, 1, 1.0, wait=0.05).status == PENDING
    assert st.step == 0
    snap = st.snapshot(4)
    assert snap.step == 0
    assert st.wait_step(1, 0, 1, G0, 5.0).status == APPLIED and st.step == 1


def test_load_and_at_checkpoint():
    st = _state()
    snap = ck_snapshot = st.prepare(3, 30.0) and st.snapshot(3)
    assert st.at_checkpoint(3)
    st.push_async("x", 1, [("w", np.ones(4))], 1.0)
    assert not st.at_checkpoint(3)
    st.load(ck_snapshot, 3, "c3")
    assert st.at_checkpoint(3) and st.step == snap.step and st.generation == "c3"
    np.testing.assert_array_equal(_w(st), np.zeros(4))
    st.raise_step(10)
    assert st.step == 10 and not st.at_checkpoint(3)


def test_a_seal_keeps_the_gate_closed_after_the_snapshot_until_its_lease_or_a_rollback():
    st = _state()
    st.push_async("a", 1, [("w", np.ones(4))], 1.0)
    st.prepare(5, lease=30.0, seal=True)
    assert st.sealed_at() is None  # not yet: the state is not in checkpoint 5
    snap = st.snapshot(5, lease=30.0)
    assert snap.step == 1 and st.sealed_at() == 5
    with pytest.raises(PSNotReadyError):  # nothing is applied after a checkpoint for a stop
        st.push_async("a", 2, [("w", np.ones(4))], 0.05)
    assert st.step == 1
    st.adopt_generation("c5")  # shard 0 restored every shard to it: training goes on
    assert st.sealed_at() is None
    assert st.push_async("a", 2, [("w", np.ones(4))], 1.0) == 2
    st.prepare(6, lease=30.0, seal=True)
    st.snapshot(6, lease=0.1)  # nobody stopped: the seal ends by itself
    assert st.push_async("a", 3, [("w", np.ones(4))], 5.0) == 3


def test_a_seal_of_a_state_already_in_a_checkpoint_and_close():
    st = _state("sync")
    st.prepare(2, lease=30.0)
    st.snapshot(2)
    st.prepare(3, lease=30.0, seal=True)  # nothing changed since checkpoint 2: kept, sealed
    assert st.sealed_at() == 2
    with ThreadPoolExecutor(1) as pool:
        pushed = pool.submit(_sync_push, st, 1, 1, 0, 1, 1.0, G0, 30.0)
        st.close()  # the shard stops: every wait ends now, nothing is applied
        assert pushed.result(timeout=5).status == PENDING
    assert st.step == 0


# ----------------------------------------------------------------------------- replicas


def _through_the_wire(ops):
    """The updates as a backup receives them: encoded in one mirror call, decoded."""
    from ps.protocol import MirrorArgs
    from ps.shard.journal import decode, encode

    heads, payload = encode(ops)
    body = b"".join(bytes(memoryview(p).cast("B")) for p in payload)
    return decode(MirrorArgs("t", heads), body)


def test_a_backup_replaying_the_journal_holds_the_primary_state_bit_for_bit():
    """Every change of a primary (a load, Adam variables, async pushes with their
    de-duplication, a step forwarded, a new generation) replayed on another state gives
    the same values, slots, step and generation, and a push repeated there after a lost
    answer is not applied twice."""
    ops: list = []
    primary, backup = ShardState(0, 1, "async"), ShardState(0, 1, "async")
    primary.journal = ops.append
    primary.load(None, None, G0)
    value = np.arange(12.0).reshape(3, 4)
    w = Slice("w", 0, 0, 3, value.shape, value.dtype.str)
    primary.create([(w, value)], {"optimizer": "adam", "lr": 0.1}, 1.0)
    rng = np.random.default_rng(0)
    for seq in range(1, 6):
        primary.push_async("c", seq, [("w", rng.normal(size=(3, 4)))], 1.0, round_id=2)
    primary.raise_step(9)
    primary.adopt_generation("c0-x")
    for op in _through_the_wire(ops):
        backup.replay(op)
    assert [op.head.kind for op in ops] == ["full", "create"] + ["apply"] * 5 + ["meta", "meta"]
    assert (backup.step, backup.generation) == (primary.step, primary.generation) == (9, "c0-x")
    np.testing.assert_array_equal(_w(backup), _w(primary))
    for name in ("m", "v", "t"):
        np.testing.assert_array_equal(backup._vars["w"].slots[name], primary._vars["w"].slots[name])
    assert backup.push_async("c", 5, [("w", np.ones((3, 4)))], 1.0) == 9  # a repeat: not applied


def test_a_backup_refuses_an_update_that_does_not_follow_its_copy():
    from ps.errors import PSReplicaError

    ops: list = []
    primary, backup = _state(), ShardState(0, 1, "async")
    primary.journal = ops.append
    backup.replay(primary.full_op())
    primary.push_async("c", 1, [("w", np.ones(4))], 1.0)
    primary.push_async("c", 2, [("w", np.ones(4))], 1.0)
    with pytest.raises(PSReplicaError, match="at step 0; update 0 makes step 2"):
        backup.replay(ops[1])  # the first of the two is missing
    backup.replay(ops[0])
    backup.replay(ops[1])
    np.testing.assert_array_equal(_w(backup), -2 * np.ones(4))
