"""Unit tests of the pure parameter-server parts: partitioner, optimizers, wire format,
the client's fan-out and create requests, what is said of failed checkpoints, chunk
staging, settings, protocol headers."""

from __future__ import annotations

import dataclasses
import itertools
import logging

import numpy as np
import pytest

from ps import wire
from ps.client.create import create_requests
from ps.client.fanout import Fanout, FanoutNestingError
from ps.errors import PSConfigError, PSShapeError, PSTransferError
from ps.optimizers import SGD, Adam, Momentum, make_optimizer
from ps.partition import Slice, assemble, home_shard, place, row_ranges, slice_for
from ps.protocol import Part
from ps.settings import ClientSettings, ServerSettings
from ps.shard.failures import CheckpointFailures
from ps.shard.staging import Staging
from rendezvous.net.rpc_wire import frame
from rendezvous.schema.ps import CheckpointFailedRecord

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


# ------------------------------------------------------------------ partition
@pytest.mark.parametrize("rows,parts", [(0, 1), (1, 1), (5, 5), (7, 3), (10, 4), (3, 1), (100, 7)])
def test_row_ranges_cover_rows_with_sizes_differing_by_at_most_one(rows, parts):
    ranges = row_ranges(rows, parts)
    assert len(ranges) == parts
    assert ranges[0][0] == 0 and ranges[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [b - a for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_row_ranges_rejects_zero_parts():
    with pytest.raises(ValueError):
        row_ranges(3, 0)


def test_small_variable_lives_whole_on_its_home_shard():
    (s,) = place("bias", (10,), "float32", 4, threshold=1024)
    assert (s.shard, s.start, s.stop, s.whole) == (home_shard("bias", 4), 0, 10, True)


def test_large_variable_is_split_on_axis0_across_every_shard():
    slices = place("w", (10, 100), "float32", 3, threshold=1024)
    assert [s.stop - s.start for s in slices] == [4, 3, 3]
    assert sorted(s.shard for s in slices) == [0, 1, 2]
    assert all(s.shape == (s.stop - s.start, 100) for s in slices)


def test_variable_with_fewer_rows_than_shards_uses_one_shard_per_row():
    slices = place("w", (2, 10000), "float64", 5, threshold=16)
    assert len(slices) == 2 and len({s.shard for s in slices}) == 2


def test_scalar_and_threshold_edge():
    (s,) = place("step", (), "int64", 3, threshold=1)
    assert s.whole and s.shape == () and s.rows == 1
    at = place("v", (256,), "float32", 2, threshold=1024)  # exactly 1024 bytes: not split
    above = place("v", (257,), "float32", 2, threshold=1024)
    assert len(at) == 1 and len(above) == 2


def test_placement_is_deterministic_and_independent_of_other_variables():
    names = [f"layer{i}/kernel" for i in range(50)]
    first = {n: place(n, (64, 8), "float32", 3, 512) for n in names}
    again = {n: place(n, (64, 8), "float32", 3, 512) for n in reversed(names)}
    assert first == again
    # a stable hash spreads whole variables over the shards
    homes = {home_shard(n, 4) for n in names}
    assert homes == {0, 1, 2, 3}


def test_split_parts_rotate_from_the_home_shard():
    slices = place("abc", (8, 64), "float64", 4, threshold=1)
    home = home_shard("abc", 4)
    assert [s.shard for s in slices] == [(home + k) % 4 for k in range(4)]


def test_slice_for_and_round_trip_dict():
    s = slice_for("w", (9, 2), "float32", 1, 3, threshold=1)
    assert s is not None and s.shard == 1
    assert Slice.from_dict(s.to_dict()) == s
    other = (home_shard("small", 3) + 1) % 3
    assert slice_for("small", (2,), "float32", other, 3, threshold=1 << 20) is None


@pytest.mark.parametrize("old_n,new_n", list(itertools.product([1, 2, 3, 5], [1, 2, 4])))
def test_assemble_recuts_any_shard_count_into_any_other(old_n, new_n):
    rng = np.random.default_rng(old_n * 10 + new_n)
    full = rng.normal(size=(11, 3))
    old = [(s, s.take(full)) for s in place("w", full.shape, full.dtype, old_n, threshold=8)]
    for target in place("w", full.shape, full.dtype, new_n, threshold=8):
        np.testing.assert_array_equal(assemble(target, old), target.take(full))


def test_assemble_scalars_and_missing_rows():
    t = Slice("t", 0, 0, 1, (), "<i8")
    assert assemble(t, [(t, np.array(7))]) == 7
    target = Slice("w", 0, 0, 4, (4, 2), "<f8")
    part = Slice("w", 1, 0, 2, (4, 2), "<f8")
    with pytest.raises(ValueError, match="cover"):
        assemble(target, [(part, np.zeros((2, 2)))])


# ------------------------------------------------------------------ optimizers
def test_sgd_in_place():
    p = np.array([1.0, 2.0])
    new = SGD(0.5).apply(p, np.array([2.0, -2.0]), {})
    np.testing.assert_allclose(new, [0.0, 3.0])
    np.testing.assert_allclose(p, [1.0, 2.0])  # parameters are never written in place


def test_float32_parameters_stay_float32_with_float64_gradients():
    p = np.ones(3, np.float32)
    for opt in (SGD(0.5), Momentum(0.5), Adam(0.5)):
        assert opt.apply(p, np.ones(3), opt.slots(p)).dtype == np.float32


def _reference_momentum(p, grads, lr, mu, nesterov):
    v = np.zeros_like(p)
    for g in grads:
        v = mu * v + g
        p = p - lr * ((g + mu * v) if nesterov else v)
    return p


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_matches_reference(nesterov):
    rng = np.random.default_rng(1)
    grads = [rng.normal(size=5) for _ in range(6)]
    opt = make_optimizer("momentum", 0.1, momentum=0.8, nesterov=nesterov)
    p = np.ones(5)
    slots = opt.slots(p)
    for g in grads:
        p = opt.apply(p, g, slots)
    np.testing.assert_allclose(p, _reference_momentum(np.ones(5), grads, 0.1, 0.8, nesterov))


def test_adam_matches_reference_and_counts_steps():
    rng = np.random.default_rng(2)
    grads = [rng.normal(size=4) for _ in range(5)]
    opt = Adam(0.01, beta1=0.8, beta2=0.9, eps=1e-6)
    p = np.zeros(4)
    slots = opt.slots(p)
    for g in grads:
        p = opt.apply(p, g, slots)
    ref, m, v = np.zeros(4), np.zeros(4), np.zeros(4)
    for t, g in enumerate(grads, 1):
        m = 0.8 * m + 0.2 * g
        v = 0.9 * v + 0.1 * g * g
        ref = ref - 0.01 * (m / (1 - 0.8**t)) / (np.sqrt(v / (1 - 0.9**t)) + 1e-6)
    np.testing.assert_allclose(p, ref, rtol=1e-5, atol=1e-9)
    assert int(slots["t"]) == 5 and slots["t"].shape == ()


def test_optimizer_config_rebuilds_the_same_optimizer():
    for opt in (SGD(0.1), Momentum(0.2, momentum=0.5), Adam(0.3, eps=1e-4)):
        again = make_optimizer(**opt.config())
        assert type(again) is type(opt) and again.config() == opt.config()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"optimizer": "rmsprop"},
        {"lr": 0},
        {"lr": float("nan")},
        {"optimizer": "sgd", "momentum": 0.9},
        {"optimizer": "adam", "beta3": 1},
    ],
)
def test_bad_optimizer_settings_are_typed_errors(kwargs):
    with pytest.raises(PSConfigError):
        make_optimizer(**{"optimizer": "sgd", "lr": 0.1, **kwargs})


# ------------------------------------------------------------------ wire
def test_wire_round_trip_of_many_dtypes_and_shapes():
    arrays: list[np.ndarray] = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.array(5, dtype=np.int64),
        np.zeros((0, 7)),
        np.array([True, False]),
        np.arange(6, dtype=">i4"),
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        np.array([1 + 2j]),
    ]
    message = wire.encode({"step": 3}, [({"name": str(i)}, a) for i, a in enumerate(arrays)])
    header, tensors = wire.decode(message)
    assert header["step"] == 3
    for (_meta, got), want in zip(tensors, arrays):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert not tensors[0][1].flags.writeable  # zero-copy view of the message


def test_wire_decode_of_a_bytearray_is_writable():
    message = bytearray(wire.encode({}, [({"name": "a"}, np.ones(3))]))
    _, [(_meta, a)] = wire.decode(message)
    a += 1
    assert a[0] == 2.0


def test_wire_rejects_objects_and_truncation():
    with pytest.raises(PSShapeError):
        wire.encode({}, [({}, np.array(["x", None], dtype=object))])
    message = wire.encode({}, [({"name": "a"}, np.ones(4))])
    with pytest.raises(PSShapeError):
        wire.decode(message[:-1])
    with pytest.raises(PSShapeError):
        wire.decode(message + b"x")


def test_encode_parts_joins_to_encode():
    tensors = [({"n": 1}, np.arange(5.0))]
    assert b"".join(wire.encode_parts({"a": 1}, tensors)) == wire.encode({"a": 1}, tensors)


# ------------------------------------------------------------------ client fan-out
@pytest.mark.parametrize("workers", [1, 3])
def test_a_fanout_task_that_fans_out_again_is_refused_at_once_not_a_deadlock(workers):
    """Every thread busy with a task that waits on the same pool would hang for good (a
    re-create of lost variables under a push did, with one shard): refused instead."""
    fanout = Fanout(workers, "test-fanout")
    try:
        with pytest.raises(FanoutNestingError):
            fanout.each(lambda i: fanout.each(lambda j: j, [i]), range(workers))
        assert fanout.each(lambda i: 2 * i, range(workers)) == {i: 2 * i for i in range(workers)}
    finally:
        fanout.shutdown()


def test_the_create_requests_of_one_shard_are_its_share_of_every_shards():
    """A re-create sends a shard what ``init`` sent it: its slices, by optimizer config."""
    sgd, adam = make_optimizer("sgd", 0.1).config(), make_optimizer("adam", 0.01).config()
    values = {
        "big": (np.arange(40.0).reshape(20, 2), sgd),  # split across the shards
        "small": (np.ones(3), adam),
        "scalar": (np.array(2.0), sgd),
    }

    def decoded(requests):
        out = []
        for args, payload in requests:
            _, tensors = wire.decode(b"".join(bytes(p) for p in payload))
            out.append((args, [(meta, a.tolist()) for meta, a in tensors]))
        return out

    every = create_requests(values, 3, 64)
    assert set(every) == {0, 1, 2}
    for i in range(3):
        alone = create_requests(values, 3, 64, only=i)
        assert list(alone) == [i]
        assert decoded(alone[i]) == decoded(every[i])


# ------------------------------------------------------------------ failed checkpoints
def test_a_streak_of_failed_checkpoints_is_said_at_once_then_once_a_minute(caplog):
    """Every attempt failing each second on a full disk makes one line a minute, with the
    count; a stop's checkpoint that fails is always said; a written one ends the streak."""
    now = [0.0]
    reports: list[CheckpointFailedRecord] = []
    failures = CheckpointFailures("/ckpt", reports.append, interval=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, "ps.shard.coordinator"):
        for second in range(130):  # attempts 1..130, one a second
            now[0] = float(second)
            failures.failed(second + 1, 10 * second, "No space left on device", (2, 7))
        assert [(r.checkpoint_id, r.attempts, r.final) for r in reports] == [
            (1, 1, False),
            (61, 61, False),
            (121, 121, False),
        ]
        now[0] = 130.5
        failures.failed(131, 1300, "No space left on device", (2, 7), final=True)
        assert (reports[-1].attempts, reports[-1].final, reports[-1].newest_step) == (131, True, 7)
        failures.written(132)
        assert failures.attempts == 0
        failures.failed(133, 1320, "shard 1 did not answer", None)  # a new streak: at once
    assert [r.attempts for r in reports] == [1, 61, 121, 131, 1]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 6 and lines[4] == "checkpoint 132 written, after 131 failed attempts"
    assert lines[1] == (
        "checkpoint 61 (step 600) failed (61 attempts in a row): No space left on device; "
        "the newest complete is checkpoint 2 (step 7)"
    )
    assert lines[3] == (
        "no final checkpoint for the stop: No space left on device; a restart resumes from "
        "checkpoint 2 (step 7)"
    )


# ------------------------------------------------------------------ staging
def _put(st: Staging, upload: str, offset: int, total: int, data) -> None:
    """What the shard's bulk port does with one part of an upload."""
    part = Part(upload, offset, len(data), total)
    st.upload_view(part)[:] = data
    st.upload_done(part)


def test_staging_reassembles_parts_in_any_order_and_detects_gaps():
    clock = [0.0]
    st = Staging(ttl=10, clock=lambda: clock[0])
    data = bytes(range(256)) * 5
    for off in (1000, 0, 500):
        _put(st, "u", off, len(data), memoryview(data)[off : off + 500])
    _put(st, "u", 0, len(data), memoryview(data)[:500])  # a retry
    assert bytes(st.take_upload("u")) == data
    with pytest.raises(PSTransferError):
        st.take_upload("u")  # taken
    _put(st, "g", 0, 10, memoryview(b"12345"))
    with pytest.raises(PSTransferError, match="incomplete"):
        st.take_upload("g")
    with pytest.raises(PSTransferError):
        _put(st, "x", 8, 10, memoryview(b"12345"))


def test_staging_downloads_expire():
    clock = [0.0]
    st = Staging(ttl=10, clock=lambda: clock[0])
    reply = st.reply({"a": 1}, b"x" * 100, inline_max=10)
    from rendezvous.net.rpc_wire import unframe

    header, _ = unframe(reply)
    assert header["total"] == 100
    part = st.download_pieces(Part(header["download"], 90, 10))
    assert b"".join(part) == b"x" * 10
    clock[0] = 100.0
    st.offer(b"y")  # any use expires old entries
    with pytest.raises(PSTransferError):
        st.download_pieces(Part(header["download"], 0, 1))
    small = st.reply({"a": 1}, b"abc", inline_max=10)
    assert small == frame({"a": 1}, [b"abc"])


# ------------------------------------------------------------------ settings
def test_settings_are_frozen_and_validated():
    s = ClientSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.lanes = 2  # type: ignore[misc]
    with pytest.raises(PSConfigError):
        ClientSettings(retry_deadline=0)
    with pytest.raises(PSConfigError):
        ServerSettings(index=2, num_shards=2)
    with pytest.raises(PSConfigError):
        ServerSettings(index=0, num_shards=1, mode="semi")


# ------------------------------------------------------------------ buffer reuse
def test_buffer_pool_reuses_a_buffer_only_after_every_view_is_gone():
    from ps.memory import BufferPool

    pool = BufferPool()
    a = pool.get(64)
    first = id(a.obj)
    array = np.frombuffer(a, dtype=np.uint8)
    part = a[8:16]
    del a
    assert id(pool.get(64).obj) != first  # still read through `array` and `part`
    del array
    assert id(pool.get(64).obj) != first
    del part
    assert id(pool.get(64).obj) == first
    assert pool.get(32).nbytes == 32


def test_unshared_sees_numpy_views_of_a_parameter():
    from ps.memory import unshared

    class Holder:
        __slots__ = ("p",)
        p: np.ndarray

    # (results taken into plain names first: pytest's assertion rewriting would hold
    # its own references to h.p while evaluating)
    h = Holder()
    h.p = np.zeros(4)
    alone = unshared(h.p, 1)
    view = h.p.reshape(-1).view(np.uint8)
    viewed = unshared(h.p, 1)
    del view
    again = unshared(h.p, 1)
    assert alone and not viewed and again and not unshared(None, 1)


def test_optimizer_output_buffer_is_used_and_param_untouched():
    p, out = np.ones(3), np.empty(3)
    got = SGD(1.0).apply(p, np.ones(3), {}, out=out)
    assert got is out and np.all(out == 0) and np.all(p == 1)
    assert SGD(1.0).apply(p, np.ones(3), {}, out=np.empty(4)).shape == (3,)  # wrong shape: new


def test_cut_slices_a_concatenation_of_pieces():
    from ps.wire import as_pieces, cut

    pieces = as_pieces([b"abc", b"", b"defg", bytearray(b"hi")])
    joined = b"abcdefghi"
    for off in range(len(joined)):
        for length in range(len(joined) - off + 1):
            assert b"".join(cut(pieces, off, length)) == joined[off : off + length]


# ------------------------------------------------------------------ protocol headers
def test_headers_round_trip_through_json_and_name_a_missing_field():
    import json

    from ps.errors import PSProtocolError
    from ps.protocol import Description, Envelope, StepArgs, StepReply, VariableInfo

    described = Description(
        1,
        2,
        "sync",
        7,
        "c3",
        (VariableInfo(Slice("w", 1, 0, 4, (4, 2), "<f8"), {"optimizer": "sgd", "lr": 0.1}),),
        64,
    )
    assert Description.from_dict(json.loads(json.dumps(described.to_dict()))) == described
    step = StepArgs(round=3, size=2, rank=1, step=9, generation="c3", wait=0.5)
    header = {**Envelope(1, inline_max=10).to_dict(), **step.to_dict()}
    assert StepArgs.from_dict(header) == step and Envelope.from_dict(header).shard == 1
    assert StepReply.from_dict({"status": "applied", "step": 1, "generation": "c0"}).round is None
    with pytest.raises(PSProtocolError, match=r"StepArgs.*generation"):
        StepArgs.from_dict({"round": 1, "size": 1, "rank": 0, "step": 1})


def test_bad_bind_address_is_a_config_error():
    with pytest.raises(PSConfigError, match="--bind"):
        ServerSettings(index=0, num_shards=1, bind="localhost")
    assert ServerSettings(index=0, num_shards=1, bind="[::1]:0").bind_endpoint.host == "::1"
