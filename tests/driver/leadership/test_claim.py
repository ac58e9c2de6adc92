"""The leader's claim on a real etcd (``driver.leadership.claim``): terms, fenced steering, a lapsed
lease taken again, a standby that waits and takes over, adoption of a live job."""

from __future__ import annotations

import threading
import uuid

import pytest

from driver.errors import JobEnded, JobFailed, JobIdInUseError, LeadershipLost
from driver.leadership import claim as claim_module
from driver.leadership.claim import DriverClaim, new_record
from driver.leadership.terms import ClaimAction
from rendezvous import open_store
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.schema.leader import DriverRecord
from rendezvous.store import Put
from tests.conftest import FAST
from tests.support.jobs import wait_until


@pytest.fixture
def etcd(etcd_server):
    with open_store(etcd_server.url, settings=FAST) as store:
        yield store


def take(store, keys, **kw) -> DriverClaim:
    taken: list[str] = []
    claim = DriverClaim.take(store, keys, new_record, on_taken=taken.append, **kw)
    return claim


@pytest.mark.timeout(60)
def test_a_fresh_job_then_a_standby_that_takes_it_over(etcd):
    keys = JobKeys(f"t{uuid.uuid4().hex[:10]}")
    etcd.put(keys.round, b"stale")  # a dead run's leftover: cleared
    first = take(etcd, keys)
    assert first.taken.action is ClaimAction.FRESH and first.record.term == 1
    assert etcd.get(keys.round) is None and etcd.get(keys.term).value == b"1"
    with pytest.raises(JobIdInUseError, match="pick another --job-id"):
        take(etcd, keys)
    # A worker of the job, alive under its own lease.
    worker_lease = etcd.grant_lease(10)
    etcd.put(keys.worker("w1"), b"{}", lease=worker_lease)

    waiting: list[DriverRecord] = []
    result: list[DriverClaim] = []
    standby = threading.Thread(
        target=lambda: result.append(take(etcd, keys, standby=True, on_wait=waiting.append))
    )
    standby.start()
    wait_until(lambda: waiting, 10, "the standby to wait on the leader")
    assert waiting == [first.record]
    first.steer([Put(keys.round, b"by term 1")])  # still leads

    first._lease.revoke()  # as if the leader died: its record vanishes
    standby.join(timeout=10)
    second = result[0]
    assert second.taken.action is ClaimAction.ADOPT and second.record.term == 2
    assert second.taken.previous == first.record and second.taken.vacant_at is not None
    assert etcd.get(keys.round).value == b"by term 1"  # adopting keeps the job's keys

    with pytest.raises(LeadershipLost, match=f"pid {second.record.pid}.*term 2"):
        first.steer([Put(keys.round, b"late write of term 1")])
    assert etcd.get(keys.round).value == b"by term 1"  # the fence held
    with pytest.raises(LeadershipLost):
        first.check()
    assert first.lost is not None
    second.steer([Put(keys.round, b"by term 2")])
    second.release(etcd)
    worker_lease.revoke()
    assert etcd.get_prefix(keys.prefix)[0] == []


@pytest.mark.timeout(60)
def test_a_leader_whose_own_lease_lapsed_takes_the_seat_again(etcd):
    keys = JobKeys(f"t{uuid.uuid4().hex[:10]}")
    claim = take(etcd, keys)
    claim._lease.stop_keep_alive()
    etcd.revoke(claim.lease_id)  # the store lost our lease (an outage past its TTL)
    claim.steer([Put(keys.round, b"still ours")])  # nobody took over: taken again
    assert etcd.get(keys.round).value == b"still ours"
    assert DriverRecord.from_json(etcd.get(keys.driver).value) == claim.record
    # Two threads that both saw the lapse (the lease's own, a fenced write) take the
    # seat once: the second finds it ours under the live lease and leaves it.
    lease = claim.lease_id
    assert claim._retake() is None and claim.lease_id == lease
    assert etcd.get(keys.driver).lease == lease
    claim.release(etcd)


def _lapsing_after_each_retake(etcd, claim: DriverClaim, times: int | None) -> list[int]:
    """Make the seat lapse again right after each re-take (``times`` times; None:
    always), as when the store's client hangs on a dead member past the 1 s lease
    between the re-take and the next write. Returns the leases revoked so far."""
    retake = claim._retake
    revoked: list[int] = []

    def retake_then_lapse():
        holder = retake()
        if times is None or len(revoked) < times:
            claim._lease.stop_keep_alive()
            etcd.revoke(claim.lease_id)
            revoked.append(claim.lease_id)
        return holder

    claim._retake = retake_then_lapse  # type: ignore[method-assign]
    return revoked


@pytest.mark.timeout(60)
def test_a_seat_that_lapses_again_after_each_retake_is_still_ours(etcd):
    """A fence that fails on our own lapsed lease is no lost lead, however many times
    in a row: once this gave up after one re-take, and a driver that still held its
    term left its job (exit 3, "a driver of a newer term took over")."""
    keys = JobKeys(f"t{uuid.uuid4().hex[:10]}")
    claim = take(etcd, keys)
    revoked = _lapsing_after_each_retake(etcd, claim, times=3)
    claim._lease.stop_keep_alive()
    etcd.revoke(claim.lease_id)
    claim.steer([Put(keys.round, b"still ours")])
    assert len(revoked) == 3 and claim.lost is None
    assert etcd.get(keys.round).value == b"still ours"
    assert DriverRecord.from_json(etcd.get(keys.driver).value) == claim.record
    claim.release(etcd)


@pytest.mark.timeout(60)
def test_a_seat_the_store_never_keeps_is_a_store_error_not_a_lost_lead(etcd, monkeypatch):
    monkeypatch.setattr(claim_module, "RETAKE_PATIENCE", 1.0)
    keys = JobKeys(f"t{uuid.uuid4().hex[:10]}")
    claim = take(etcd, keys)
    _lapsing_after_each_retake(etcd, claim, times=None)
    claim._lease.stop_keep_alive()
    etcd.revoke(claim.lease_id)
    with pytest.raises(RendezvousError, match="lapsed again after each re-take for 1s"):
        claim.steer([Put(keys.round, b"never written")])
    assert claim.lost is None and etcd.get(keys.round) is None
    claim.release(etcd)


@pytest.mark.timeout(60)
def test_a_standby_whose_job_ends_under_its_leader_has_nothing_to_take(etcd):
    keys = JobKeys(f"t{uuid.uuid4().hex[:10]}")
    leader = take(etcd, keys)
    errors: list[BaseException] = []
    waiting: list[DriverRecord] = []

    def stand_by() -> None:
        try:
            take(etcd, keys, standby=True, on_wait=waiting.append)
        except (JobEnded, JobFailed) as exc:
            errors.append(exc)

    standby = threading.Thread(target=stand_by)
    standby.start()
    wait_until(lambda: waiting, 10, "the standby to wait on the leader")
    leader.release(etcd)  # the job ends: its keys go
    standby.join(timeout=10)
    assert len(errors) == 1 and isinstance(errors[0], JobEnded), errors


@pytest.mark.timeout(30)
def test_a_standby_stops_waiting_when_told(etcd):
    keys = JobKeys(f"t{uuid.uuid4().hex[:10]}")
    leader = take(etcd, keys)
    stop = threading.Event()
    stop.set()
    with pytest.raises(JobFailed, match="never led"):
        take(etcd, keys, standby=True, stop=stop)
    leader.release(etcd)


@pytest.mark.timeout(60)
def test_a_standby_ends_the_lease_of_a_leader_that_stopped_beating(etcd):
    """The leader's lease is still kept alive, but its beat stopped (a stalled
    driver): the standby ends that lease and takes over within seconds."""
    keys = JobKeys(f"t{uuid.uuid4().hex[:10]}")
    leader = take(etcd, keys, beats=True)
    worker_lease = etcd.grant_lease(10)
    etcd.put(keys.worker("w1"), b"{}", lease=worker_lease)
    wait_until(lambda: etcd.get(keys.leader_beat) is not None, 10, "the leader's beat")
    waiting: list[DriverRecord] = []
    result: list[DriverClaim] = []
    standby = threading.Thread(
        target=lambda: result.append(take(etcd, keys, standby=True, on_wait=waiting.append))
    )
    standby.start()
    wait_until(lambda: waiting, 10, "the standby to wait on the leader")
    leader._released.set()  # its beat stops; its lease's keep-alive goes on
    standby.join(timeout=20)
    assert result and result[0].record.term == 2
    with pytest.raises(LeadershipLost):
        leader.check()
    leader._lease.stop_keep_alive()
    result[0].release(etcd)
    worker_lease.revoke()


@pytest.mark.timeout(60)
def test_keys_deleted_from_under_the_leader_are_said_as_such(etcd):
    """Someone deletes every key of the job (the term too): the leader's next steer
    says that, not that a driver "pid 0 on host ?" took over."""
    keys = JobKeys(f"t{uuid.uuid4().hex[:10]}")
    claim = take(etcd, keys)
    claim._lease.stop_keep_alive()
    etcd.delete_prefix(keys.prefix)
    etcd.revoke(claim.lease_id)
    with pytest.raises(LeadershipLost, match="keys were deleted from the store by someone else"):
        claim.steer([Put(keys.round, b"never written")])
    assert "pid 0" not in (claim.lost or "")


@pytest.mark.timeout(60)
def test_a_seat_held_by_an_unsigned_record_is_refused_not_spun_on(etcd_server):
    """A stranger (no secret) writes the leader's seat: a driver of the job, which
    ignores that record, says so in one line instead of trying for ever."""
    keys = JobKeys(f"t{uuid.uuid4().hex[:10]}")
    with (
        open_store(etcd_server.url, "job-secret", FAST) as job,
        open_store(etcd_server.url, settings=FAST) as stranger,
    ):
        stranger.put(keys.driver, DriverRecord("x", "evil", 1, 0.0, 9).to_json())
        with pytest.raises(JobFailed, match="holds a record without the job's signature"):
            take(job, keys)
        assert stranger.get(keys.driver) is not None  # (nothing touched)
