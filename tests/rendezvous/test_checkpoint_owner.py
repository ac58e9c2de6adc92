"""One job per checkpoint folder: the owner decision (pure), and the claim on a real
folder (the lock, the record written whole, a record not to be trusted)."""

from __future__ import annotations

import json
import os

import pytest

from rendezvous import checkpoint_owner as owner
from rendezvous.checkpoint_claim import LOCK, RECORD, CheckpointDirInUseError, FolderClaim
from rendezvous.checkpoint_owner import (
    BUSY,
    HELD,
    NO_LOCKS,
    REFUSE,
    SHARE,
    STALE,
    TAKE,
    Claimant,
    OwnerRecord,
    Seen,
    decide,
)
from tests.support.jobs import wait_until

HOST = "node-1"


def record(job: str = "x", host: str = HOST) -> OwnerRecord:
    return OwnerRecord(job, host, 4242, 1_700_000_000.0)


def me(job: str = "x", given: bool = True, shared: bool = False) -> Claimant:
    return Claimant(job, HOST, given, shared)


def verdict(seen: Seen, claimant: Claimant) -> tuple[str, str]:
    v = decide("/ckpt", seen, claimant)
    return v.action, v.job_id


@pytest.mark.unit
def test_a_folder_without_a_record_is_taken_for_this_job():
    assert verdict(Seen(None, 0.0, HELD), me("y", given=False)) == (TAKE, "y")


@pytest.mark.unit
def test_a_dead_drivers_folder_is_taken_and_without_job_id_as_its_job():
    """A driver that died without cleaning up does not block: its lock is free on its
    own host, or its record is stale seen from another."""
    dead_here = Seen(record("x"), 1.0, HELD)
    assert verdict(dead_here, me("x")) == (TAKE, "x")  # the same job resumed
    assert verdict(dead_here, me("fresh", given=False)) == (TAKE, "x")  # the same command
    stale_there = Seen(record("x", host="node-2"), STALE + 1, HELD)
    assert verdict(stale_there, me("fresh", given=False)) == (TAKE, "x")
    taken_over = decide("/ckpt", dead_here, me("y"))
    assert (taken_over.action, taken_over.job_id) == (TAKE, "y")
    assert "job x's snapshots there are kept" in taken_over.why and "--job-id x" in taken_over.why


@pytest.mark.unit
def test_a_live_jobs_folder_is_refused_naming_the_folder_and_the_job():
    for seen in (
        Seen(record("x"), 100.0, BUSY),  # the lock is held, whatever the record's age
        Seen(record("x", host="node-2"), 2.0, HELD),  # refreshed by another host's driver
        Seen(record("x"), 2.0, NO_LOCKS),  # no locks here: the record's age tells
    ):
        for claimant in (me("y"), me("fresh", given=False), me("y", shared=True)):
            v = decide("/ckpt", seen, claimant)
            assert v.action == REFUSE, (seen, claimant)
            assert "--checkpoint-dir /ckpt is in use by job x (driver pid 4242" in v.why
            assert "\n" not in v.why
            assert ("refreshed" in v.why) == (seen.lock != BUSY), v.why


@pytest.mark.unit
def test_a_live_driver_of_the_same_job_is_shared_only_where_a_job_has_several():
    live = Seen(record("x"), 1.0, BUSY)
    assert verdict(live, me("x", shared=True)) == (SHARE, "x")  # a --standby, a --join node
    second = decide("/ckpt", live, me("x"))  # the embedded store: a second job of one id
    assert second.action == REFUSE and "--standby" in second.why


@pytest.mark.unit
@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b'{"format": 1, "job_id": 3, "host": "h", "pid": 1, "since": 0}',
        b'{"format": 1, "job_id": "j", "host": "h", "pid": true, "since": 0}',
    ],
)
def test_a_record_no_driver_writes_is_refused(data):
    with pytest.raises(ValueError):
        OwnerRecord.from_json(data)


def test_a_second_claim_on_a_held_folder_is_refused_and_the_first_keeps_it(tmp_path):
    """The lock is per open file: a second claim, even from this process, finds it held."""
    first, v = FolderClaim.claim(str(tmp_path), me("x"))
    try:
        assert v.action == TAKE and (tmp_path / LOCK).exists()
        written = json.loads((tmp_path / RECORD).read_text())
        assert (written["job_id"], written["pid"]) == ("x", os.getpid())
        assert oct((tmp_path / RECORD).stat().st_mode & 0o777) == "0o600"
        with pytest.raises(CheckpointDirInUseError, match="is in use by job x"):
            FolderClaim.claim(str(tmp_path), me("y"))
        assert json.loads((tmp_path / RECORD).read_text())["job_id"] == "x"  # untouched
        assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]
    finally:
        first.close()
    again, v = FolderClaim.claim(str(tmp_path), me("fresh", given=False))
    again.close()
    assert (v.action, v.job_id) == (TAKE, "x")  # the lock is free: the folder's job again


def test_a_record_that_is_not_to_be_trusted_is_said_not_used(tmp_path):
    (tmp_path / RECORD).write_text("{not json")
    with pytest.raises(CheckpointDirInUseError, match=r"owner record .* is not usable"):
        FolderClaim.claim(str(tmp_path), me("x"))
    os.unlink(tmp_path / RECORD)
    os.symlink("/etc/passwd", tmp_path / RECORD)
    with pytest.raises(CheckpointDirInUseError, match="symbolic link"):
        FolderClaim.claim(str(tmp_path), me("x"))


@pytest.mark.timeout(30)
def test_the_holder_refreshes_its_record_and_a_sharer_takes_the_folder_when_it_is_free(
    tmp_path,
):
    first, _ = FolderClaim.claim(str(tmp_path), me("x"), refresh=0.05, pid=111)
    os.utime(tmp_path / RECORD, (1.0, 1.0))
    standby, v = FolderClaim.claim(str(tmp_path), me("x", shared=True), pid=222)
    assert v.action == SHARE
    try:
        assert json.loads((tmp_path / RECORD).read_text())["pid"] == 111
        wait_until(lambda: (tmp_path / RECORD).stat().st_mtime > 1.0, 10, "a refresh")
        first.close()  # the leader is gone: its lock drops
        wait_until(lambda: json.loads((tmp_path / RECORD).read_text())["pid"] == 222, 10, "taken")
    finally:
        standby.close()


def test_the_module_constants_agree():
    assert owner.REFRESH * 3 < owner.STALE  # a live driver is never taken for a dead one
