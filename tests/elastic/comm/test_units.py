"""Pure logic of the data plane: layouts, wire formats, settings, MPI detection, the
allgather layout, the world-of-one transport, the overlap thread and the rules that
fit the shared-memory waits and the leader's network thread to the host's CPUs."""

from __future__ import annotations

import dataclasses
import os
import threading

import numpy as np
import pytest

from elastic.comm import CommSettings, Membership, detect_mpi, layout, wire
from elastic.comm.transports.base import LocalTransport, Mismatch, PeerGone, gather_layout
from elastic.comm.transports.cpus import quota_cpus, quota_files, usable_cpus
from elastic.comm.transports.overlap import Overlap
from elastic.comm.transports.selection import leader_overlaps
from elastic.comm.transports.shm import default_spin_us
from rendezvous.net.auth import make_nonce
from rendezvous.net.url import Endpoint
from tests.support.comm.oracle import reduce_reference

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


@pytest.mark.parametrize("n_elems,parts", [(0, 1), (0, 4), (3, 4), (10, 3), (1001, 4), (8, 8)])
def test_ring_segments_cover_everything_evenly(n_elems, parts):
    segs = layout.ring_segments(n_elems, parts)
    assert len(segs) == parts and segs[0][0] == 0 and segs[-1][1] == n_elems
    assert all(a[1] == b[0] for a, b in zip(segs, segs[1:]))
    sizes = [b - a for a, b in segs]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    with pytest.raises(ValueError):
        layout.ring_segments(5, 0)


def test_chunk_ranges():
    assert layout.chunk_ranges(3, 10, 3) == [(3, 6), (6, 9), (9, 10)]
    assert layout.chunk_ranges(5, 5, 3) == []
    assert layout.elems_per_chunk(100, 8) == 12 and layout.elems_per_chunk(3, 8) == 1
    with pytest.raises(ValueError):
        layout.chunk_ranges(0, 4, 0)


def test_op_and_dtype_checks():
    for op in layout.REDUCE_OPS:
        assert layout.check_reduce_op(op) == op
    with pytest.raises(ValueError):
        layout.check_reduce_op("prod")
    for dt in (np.float32, np.float64, np.int32, np.int64, np.uint8, np.float16):
        layout.check_reduce_dtype(dt)
    for refused in (np.bool_, np.complex64, object, "U3", [("a", "i4")]):
        with pytest.raises(TypeError):
            layout.check_reduce_dtype(refused)
    layout.check_transfer_dtype(np.complex64)
    with pytest.raises(TypeError):
        layout.check_transfer_dtype(object)


def test_as_contiguous_keeps_0d_and_fixes_order_and_strides():
    assert layout.as_contiguous(np.float32(3)).shape == ()
    a = np.arange(12).reshape(3, 4)[:, ::2]
    c = layout.as_contiguous(a)
    assert c.flags.c_contiguous and np.array_equal(c, a)
    b = layout.as_contiguous(np.arange(3, dtype=">i4"))
    assert b.dtype.isnative and b.tolist() == [0, 1, 2]
    x = np.arange(4)
    assert layout.as_contiguous(x) is x


def test_integer_average_floors_and_keeps_dtype():
    got = reduce_reference(
        [np.array([1, -1, 7], np.int32), np.array([2, 0, 0], np.int32)], "average"
    )
    assert got.dtype == np.int32 and got.tolist() == [1, -1, 3]
    f = reduce_reference([np.array([1], np.float32), np.array([2], np.float32)], "average")
    assert f.dtype == np.float32 and f.tolist() == [1.5]


def test_hello_roundtrip_and_rejections():
    h = wire.Hello(wire.CHANNEL_CTRL, 7, 2, 3, 4, make_nonce())
    data = wire.encode_hello(h)
    assert len(data) == wire.HELLO_SIZE and wire.decode_hello(data) == h
    for bad in (data[:-1], b"XXXX" + data[4:], data[:4] + b"\x09" + data[5:]):
        with pytest.raises(wire.WireError):
            wire.decode_hello(bad)
    with pytest.raises(wire.WireError):  # rank out of range
        wire.decode_hello(wire.encode_hello(wire.Hello(0, 1, 5, 0, 2, make_nonce())))


def test_proofs_bind_secret_direction_and_hello():
    hello = wire.encode_hello(wire.Hello(0, 1, 1, 0, 2, make_nonce()))
    other = wire.encode_hello(wire.Hello(0, 2, 1, 0, 2, make_nonce()))
    nonce = make_nonce()
    proofs = wire.HANDSHAKE
    sp = proofs.server_proof("s", hello)
    assert proofs.check_server_proof("s", hello, sp)
    assert not proofs.check_server_proof("t", hello, sp)
    assert not proofs.check_server_proof("s", other, sp)
    cp = proofs.client_proof("s", hello, nonce)
    assert proofs.check_client_proof("s", hello, nonce, cp)
    assert not proofs.check_client_proof("s", hello, make_nonce(), cp)
    # A server's answer is no use as a client's answer (and vice versa).
    assert not proofs.check_client_proof("s", hello, hello[-16:], sp)


def test_ctrl_parser_handles_split_and_merged_messages():
    msgs = (
        wire.encode_ctrl(wire.CTRL_HEARTBEAT)
        + wire.encode_closing(3, "new round")
        + wire.encode_abort(wire.ABORT_LOST, 2, "rank 2 lost")
    )
    p = wire.CtrlParser()
    out = []
    for i in range(len(msgs)):
        out += p.feed(msgs[i : i + 1])
    assert [k for k, _ in out] == [wire.CTRL_HEARTBEAT, wire.CTRL_CLOSING, wire.CTRL_ABORT]
    assert wire.decode_closing(out[1][1]) == (3, "new round")
    assert wire.decode_abort(out[2][1]) == (wire.ABORT_LOST, 2, "rank 2 lost")
    assert wire.decode_abort(wire.encode_abort(1, None, "x")[3:])[1] is None


def test_op_header_roundtrip_and_mismatch_descriptions():
    h = wire.OpHeader(
        wire.KIND_ALLREDUCE, 9, op=1, dtype_code=11, nelem=100, shape_crc=layout.shape_crc((10, 10))
    )
    assert wire.OpHeader.decode(h.encode()) == h
    assert wire.header_mismatch(h, h) is None
    other = wire.OpHeader(wire.KIND_BROADCAST, 9, root=0)
    mismatch = wire.header_mismatch(h, other)
    assert mismatch is not None and "broadcast #9" in mismatch
    bigger = wire.OpHeader(
        wire.KIND_ALLREDUCE, 9, op=1, dtype_code=11, nelem=101, shape_crc=h.shape_crc
    )
    mismatch = wire.header_mismatch(h, bigger)
    assert mismatch is not None and "nelem" in mismatch
    assert layout.shape_crc((10, 10)) != layout.shape_crc((100,))
    with pytest.raises(wire.WireError):
        wire.OpHeader.decode(b"\x00" * wire.OP_HEADER_SIZE)


def test_array_meta_roundtrip():
    for dt, shape in ((np.dtype("<f4"), ()), (np.dtype("U3"), (2, 0, 5)), (np.dtype("?"), (7,))):
        enc = wire.encode_array_meta(dt, shape)
        assert wire.decode_meta_len(enc[:4]) == len(enc) - 4
        assert wire.decode_array_meta_body(enc[4:]) == (dt, shape)
    with pytest.raises(wire.WireError):
        wire.decode_array_meta_body(b"nonsense\x00")


def test_settings_validation_and_heartbeat_default():
    s = CommSettings()
    assert s.connect_timeout == 30.0 and s.peer_timeout == 30.0
    # Heartbeats every 0.1 s: a silent neighbour is reported after suspect_after (0.8 s).
    assert s.suspect_after == 0.8 and s.effective_heartbeat_interval == 0.1
    assert CommSettings(peer_timeout=0.2).effective_heartbeat_interval == 0.05
    assert CommSettings(suspect_after=0.2).effective_heartbeat_interval == 0.05
    for bad in (
        {"peer_timeout": 0},
        {"transport": "udp"},
        {"chunk_bytes": 10},
        {"heartbeat_interval": 5.0, "peer_timeout": 2.0},
        {"shm_spin_us": -1},
        {"leader_overlap": "false"},
    ):
        with pytest.raises(ValueError):
            CommSettings(**bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.peer_timeout = 3  # type: ignore[misc]  # frozen: the assignment must fail


def test_membership_validation():
    with pytest.raises(ValueError):
        Membership(1, 2, ("a:1", "b:2"), "s")
    with pytest.raises(ValueError):
        Membership(1, 0, (), "s")
    with pytest.raises(ValueError):
        Membership(1, 0, ("a:1",), "")
    assert Membership(1, 1, ["a:1", "b:2"], "s").size == 2


def test_addresses():
    # Listener addresses are written and read by the one HOST:PORT helper.
    assert str(Endpoint("::1", 5)) == "[::1]:5" and Endpoint.parse("[::1]:5").sockaddr == ("::1", 5)
    assert Endpoint.parse("host.example:80").sockaddr == ("host.example", 80)
    for bad in ("nohost", ":80", "h:x"):
        with pytest.raises(ValueError):
            Endpoint.parse(bad)


def test_detect_mpi():
    assert not detect_mpi({})
    assert not detect_mpi({"PMI_RANK": ""})
    for var in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID", "PMIX_RANK"):
        assert detect_mpi({var: "0"})


def test_output_cache_reuses_only_memory_nobody_can_reach():
    from elastic.comm.outbuf import OutputCache

    cache = OutputCache(min_bytes=1024, max_entries=2)
    a = cache.empty((1000,), np.float32)
    ptr = a.ctypes.data
    a[:] = 1
    del a
    b = cache.empty((10, 100), np.float32)  # same bytes, dropped: reused
    assert b.ctypes.data == ptr and b.shape == (10, 100)
    view = b[3:]  # a live view pins the memory
    del b
    c = cache.empty((1000,), np.float32)
    assert c.ctypes.data != ptr
    del view
    c_ptr = c.ctypes.data
    mv = c.data  # so does a buffer export (a memoryview of c)
    del c
    d = cache.empty((1000,), np.float32)
    assert d.ctypes.data == ptr  # the first one is free again
    e = cache.empty((1000,), np.float32)
    assert e.ctypes.data not in (ptr, c_ptr)
    del mv
    small = cache.empty((3,), np.float64)  # below min_bytes: plain allocation
    assert small.shape == (3,)
    held = [cache.empty((500,), np.float64) for _ in range(5)]  # more than max_entries
    assert len({h.ctypes.data for h in held}) == 5


def test_gather_layout_and_its_mismatches():
    f4, f8 = np.dtype("<f4"), np.dtype("<f8")
    dtype, shape, offsets = gather_layout([(f4, (2, 3)), (f4, (0, 3)), (f4, (1, 3))])
    assert (dtype, shape, offsets) == (f4, (3, 3), [0, 24, 24, 36])
    with pytest.raises(Mismatch, match="dtypes differ"):
        gather_layout([(f4, (2, 3)), (f8, (2, 3))])
    with pytest.raises(Mismatch, match="beyond axis 0"):
        gather_layout([(f4, (2, 3)), (f4, (2, 4))])
    assert str(PeerGone(2, "connection closed")) == "rank 2: connection closed"


def test_local_transport_copies():
    t = LocalTransport()
    hdr = wire.OpHeader(wire.KIND_ALLREDUCE, 1)
    x = np.arange(4.0)
    out = np.empty_like(x)
    t.allreduce(x, out, "sum", hdr)
    assert out.tolist() == x.tolist()
    b = t.broadcast(x, 0, hdr)
    assert b.tolist() == x.tolist() and not np.shares_memory(b, x)
    g, rows = t.allgather(x.reshape(2, 2), hdr)
    assert rows == [2] and g.tolist() == [[0.0, 1.0], [2.0, 3.0]] and not np.shares_memory(g, x)
    t.barrier(hdr)
    t.abort(orderly=True)
    t.close()
    assert t.name == "local"


@pytest.mark.timeout(10)
def test_overlap_runs_jobs_one_at_a_time_and_raises_their_errors():
    ran: list[int] = []
    release = threading.Event()

    def held() -> None:
        release.wait(5)
        ran.append(1)

    overlap = Overlap("test-overlap")
    overlap.start(held)
    with pytest.raises(RuntimeError):  # a job at a time: wait before the next start
        overlap.start(lambda: ran.append(2))
    release.set()
    overlap.wait(lambda: None)
    assert ran == [1]

    def fails() -> None:
        raise PeerGone(3, "connection closed")

    overlap.start(fails)
    with pytest.raises(PeerGone) as e:
        overlap.wait(lambda: None)
    assert e.value.rank == 3
    overlap.wait(lambda: None)  # nothing running: the error was raised once
    overlap.close()
    overlap.close()
    with pytest.raises(RuntimeError):
        overlap.start(lambda: None)


@pytest.mark.timeout(10)
def test_overlap_close_lets_a_running_job_finish():
    release, done = threading.Event(), threading.Event()

    def job() -> None:
        release.wait(5)
        done.set()

    overlap = Overlap("test-overlap")
    overlap.start(job)
    closer = threading.Thread(target=overlap.close)
    closer.start()
    release.set()
    closer.join(5)
    assert done.is_set() and not closer.is_alive()


def test_waits_spin_and_leaders_overlap_only_with_a_cpu_for_every_busy_thread():
    # Two members on two CPUs: no CPU to spare for a leader's network thread.
    assert not leader_overlaps(None, host_members=2, cpus=2)
    # Their waits spin alone on the host (one busy thread per CPU), not beside the
    # leader's network step, which counts as a third busy thread (selection._build).
    assert default_spin_us(2, cpus=2) > 0
    assert default_spin_us(2 + 1, cpus=2) == 0
    # Three CPUs: the network thread gets one, and with it the waits still spin.
    assert leader_overlaps(None, host_members=2, cpus=3)
    assert default_spin_us(2 + 1, cpus=3) > 0
    # The setting wins over the rule, both ways.
    assert leader_overlaps(True, host_members=4, cpus=1)
    assert not leader_overlaps(False, host_members=1, cpus=64)


def test_cgroup_quotas_read_as_cpus():
    assert quota_cpus("150000", "100000") == 1.5
    assert quota_cpus("max", "100000") is None  # v2: no limit
    assert quota_cpus("-1", "100000") is None  # v1: no limit
    assert quota_cpus("", "100000") is None
    assert quota_cpus("inf", "100000") is None
    # Its group and each ancestor, v1 under both names of the controller's mount.
    v2_and_v1 = "12:cpu,cpuacct:/pod7/ctr\n3:memory:/pod7\n0::/pod7/ctr\n"
    v1 = [
        (f"{mount}/{group}cpu.cfs_quota_us", f"{mount}/{group}cpu.cfs_period_us")
        for mount in ("cpu,cpuacct", "cpu")
        for group in ("pod7/ctr/", "pod7/", "")
    ]
    v2 = [("pod7/ctr/cpu.max",), ("pod7/cpu.max",), ("cpu.max",)]
    assert quota_files(v2_and_v1) == v1 + v2
    assert quota_files("garbage\n\n") == []
    assert quota_files("0::/../elsewhere\n") == []  # outside this cgroup namespace


def _write_quota(root, files: tuple[str, ...], cpus: float) -> None:
    texts = (
        [f"{cpus * 100000:.0f} 100000"] if len(files) == 1 else [f"{cpus * 100000:.0f}", "100000"]
    )
    for name, text in zip(files, texts):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")


def test_usable_cpus_take_the_smallest_quota_of_this_process_cgroups(tmp_path):
    # This process's own cgroup paths, under stand-in roots.
    with open("/proc/self/cgroup") as f:
        files = quota_files(f.read())
    assert files, "this process belongs to no cgroup"
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(tmp_path / "none") == affinity
    # A quota of 1.5 CPUs on its own group: 2 CPUs to keep busy at most (rounded up).
    _write_quota(tmp_path / "own", files[0], 1.5)
    assert usable_cpus(tmp_path / "own") == min(2, affinity)
    # A container's mount shows its own group at the root: found there too, and the
    # smaller of two quotas binds.
    top = [f for f in files if all("/" not in name for name in f)]
    assert top, files
    _write_quota(tmp_path / "nested", files[0], 3)
    _write_quota(tmp_path / "nested", top[0], 0.5)
    assert usable_cpus(tmp_path / "nested") == 1
