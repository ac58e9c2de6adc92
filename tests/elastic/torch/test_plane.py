"""The process-group plane of ``elastic.torch`` in one process: which plane a tensor
takes (pure), torch's ``Store`` over the job's store, and a two-member gloo group formed
over it whose pending collective ends at the round's end (a stand-in ring)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from elastic.errors import PeerLostError, WorkerLostError
from elastic.torch.plane.backends import GlooBackend, GroupSettings
from elastic.torch.plane.choice import BackendUnavailableError, plane_for
from elastic.torch.plane.group import RoundGroup
from elastic.torch.plane.group_ops import row_signature
from elastic.torch.plane.rounds import group_settings, stale_rounds
from elastic.torch.plane.store import RoundStore, RoundStoreStopped
from rendezvous import open_store
from rendezvous.keys import JobKeys

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "setting, device, size, world, nccl, want",
    [
        ("auto", "cuda", 4, "elastic", True, "nccl"),
        ("auto", "cpu", 4, "elastic", True, "ring"),
        ("auto", "cuda", 4, "elastic", False, "ring"),  # staged through host memory
        ("ring", "cuda", 4, "elastic", True, "ring"),
        ("gloo", "cpu", 4, "elastic", False, "gloo"),
        ("gloo", "cuda", 4, "elastic", True, "gloo"),
        ("nccl", "cuda", 4, "elastic", True, "nccl"),
        ("nccl", "cpu", 4, "elastic", True, "ring"),  # NCCL carries no host memory
        ("gloo", "cpu", 1, "alone", False, "ring"),  # a world of one has nothing to send
        ("auto", "cuda", 4, "mpi", True, "ring"),  # MPI's fixed world
    ],
)
def test_plane_for(setting, device, size, world, nccl, want):
    assert plane_for(setting, device, size=size, world=world, nccl_available=nccl) == want


def test_plane_for_refuses_what_cannot_run():
    with pytest.raises(BackendUnavailableError, match="no NCCL"):
        plane_for("nccl", "cuda", size=2, world="elastic", nccl_available=False)
    with pytest.raises(BackendUnavailableError, match="needs elastic-run"):
        plane_for("gloo", "cpu", size=2, world="mpi", nccl_available=False)
    with pytest.raises(ValueError, match="unknown"):
        plane_for("mpi", "cpu", size=2, world="elastic", nccl_available=False)


class SliceWork:
    """A collective (pure logic: no I/O) whose first wait of a slice times out as it
    ends: torch says "timed out", and the work is complete when looked at."""

    def __init__(self, error: Exception | None):
        self.error, self.waits = error, 0

    def wait(self, timeout=None):
        self.waits += 1
        if timeout is not None and self.waits == 1:
            raise RuntimeError("Operation timed out!")
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self):
        return self.waits >= 1


def test_a_collective_ending_as_its_wait_slice_times_out_is_its_own_outcome():
    """The race seen in a benchmark: the slice's "timed out" was taken for the
    collective's failure when the collective had just finished."""
    aborted = threading.Event()
    assert GlooBackend().wait(SliceWork(None), aborted, timeout=5.0) is True
    with pytest.raises(RuntimeError, match="Connection closed"):
        GlooBackend().wait(SliceWork(RuntimeError("Connection closed by peer")), aborted, 5.0)


def test_a_finished_collective_stands_though_the_round_ended_before_its_wait():
    """Seen in a full run: a survivor's last allreduce had finished when its peer, done
    with its last step, exited and closed the ring; the wait read the round's end as a
    loss, and the survivor rolled back into a round that never came (training had
    finished). A collective still waiting is cut short."""
    aborted = threading.Event()
    aborted.set()
    finished = SliceWork(None)
    finished.waits = 1
    assert GlooBackend().wait(finished, aborted, timeout=5.0) is True
    assert GlooBackend().wait(SliceWork(None), aborted, timeout=5.0) is False


def test_stale_rounds_and_settings():
    keys = JobKeys("j")
    found = [keys.torch_group(r) + "0/0" for r in (3, 7, 10, 12)] + [keys.round]
    assert stale_rounds(found, keys.torch_groups, current=10) == [3, 7]
    assert keys.torch_group(1) != keys.torch_group(10)[: len(keys.torch_group(1))]
    from elastic.comm import CommSettings

    s = group_settings(CommSettings(peer_timeout=30, connect_timeout=5), "10.0.0.2")
    assert (s.connect_timeout, s.op_timeout, s.bind_host) == (5, 120, "10.0.0.2")
    assert row_signature(torch.zeros(3, 2)) == row_signature(torch.ones(5, 2))
    assert row_signature(torch.zeros(3, 2)) != row_signature(torch.zeros(3, 2, 1))


@pytest.fixture
def kv(embedded_server):
    client = open_store(f"embedded://{embedded_server.address}", embedded_server.secret)
    yield client
    client.close()


def test_round_store_speaks_torch_store(kv):
    stop = threading.Event()
    store = RoundStore(kv, "/elastic/j/torch/4/", stop.is_set, timeout=5)
    other = RoundStore(kv, "/elastic/j/torch/5/", stop.is_set, timeout=5)
    store.set("a", b"1")
    assert store.get("a") == b"1" and not other.check(["a"])  # one round's keys only
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.compare_set("c", b"", b"x") == b"x"  # absent and expected empty: set
    assert store.compare_set("c", b"y", b"z") == b"x"  # another value: left
    assert store.compare_set("c", b"x", b"z") == b"z"
    assert store.check(["a", "n"]) and store.num_keys() == 3
    assert store.delete_key("a") and not store.delete_key("a")
    threading.Timer(0.1, lambda: store.set("late", b"v")).start()
    assert store.get("late") == b"v"  # a blocking read waits for the key
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    with pytest.raises(RoundStoreStopped, match="round ended"):
        store.get("never")
    assert time.monotonic() - started < 1.0


class StandInRing:
    """What a ``RoundGroup`` asks of its round's ring: rank, size, and its end."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self._closed = threading.Event()
        self.error: WorkerLostError | None = None

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def wait_closed(self, timeout: float | None = None) -> bool:
        return self._closed.wait(timeout)

    def lose(self, rank: int) -> None:
        self.error = PeerLostError(f"rank {rank} lost", rank=rank)
        self._closed.set()


def form(kv, rings, round_id=1):
    """The gloo groups of ``rings`` (one per member), formed in threads as members do."""
    groups: list = [None] * len(rings)
    prefix = JobKeys("j").torch_group(round_id)

    def build(rank):
        groups[rank] = RoundGroup(
            GlooBackend(), kv, prefix, rings[rank], round_id, GroupSettings(connect_timeout=10)
        )

    threads = [threading.Thread(target=build, args=(r,)) for r in range(len(rings))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return groups


def test_gloo_group_reduces_and_its_pending_collective_ends_with_the_round(kv):
    rings = [StandInRing(r, 2) for r in range(2)]
    groups = form(kv, rings)
    tensors = [torch.full((4,), float(r + 1)) for r in range(2)]
    pending = [g.start_allreduce(t, "average") for g, t in zip(groups, tensors)]
    for p in pending:
        p.wait()
    assert all(t.tolist() == [1.5] * 4 for t in tensors)
    # Rank 1 never joins the next allreduce; rank 0's ends when its ring loses rank 1.
    waiting = groups[0].start_allreduce(torch.ones(4), "sum")
    threading.Timer(0.2, rings[0].lose, args=(1,)).start()
    started = time.monotonic()
    with pytest.raises(PeerLostError, match="rank 1 lost"):
        waiting.wait()
    assert time.monotonic() - started < 1.0
    assert groups[0].aborted
    with pytest.raises(PeerLostError):  # and every later collective of the round
        groups[0].start_broadcast(torch.ones(1), 0)


def test_group_that_cannot_form_raises_worker_lost(kv):
    ring = StandInRing(0, 2)  # its peer never comes: the round ends meanwhile
    threading.Timer(0.2, ring.lose, args=(1,)).start()
    started = time.monotonic()
    with pytest.raises(PeerLostError):
        RoundGroup(GlooBackend(), kv, JobKeys("j").torch_group(2), ring, 2, GroupSettings(10))
    assert time.monotonic() - started < 2.0


def test_the_setting_comes_from_init_or_the_environment(monkeypatch):
    from elastic import context

    # (what init() keeps; torch_backend() answers it once a world is open)
    monkeypatch.delenv("ELASTIC_TORCH_BACKEND", raising=False)
    assert context._checked_torch_backend(None) == "auto"
    monkeypatch.setenv("ELASTIC_TORCH_BACKEND", "gloo")
    assert context._checked_torch_backend(None) == "gloo"
    assert context._checked_torch_backend("nccl") == "nccl"  # the argument wins
    monkeypatch.setenv("ELASTIC_TORCH_BACKEND", "mpi")
    with pytest.raises(ValueError, match="ELASTIC_TORCH_BACKEND='mpi'"):
        context._checked_torch_backend(None)
    with pytest.raises(ValueError, match="torch_backend='fast'"):
        context.init(torch_backend="fast")
