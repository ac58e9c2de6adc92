"""The driver's claim on its ``--checkpoint-dir`` (and ``--ps-checkpoint-dir``) at the
start: one job per checkpoint folder (``rendezvous.checkpoint_owner``). A second job on a folder in use is refused
(a usage error: one line naming the folder and the job that holds it, exit 2); a job
started without ``--job-id`` on a folder is the folder's job (the same command started
again resumes it); the hold lasts as long as the driver (``FolderClaim``)."""

from __future__ import annotations

import dataclasses
import os
import socket

from driver.config import JobConfig
from driver.errors import UsageError
from driver.flags import DEFAULT_RENDEZVOUS
from rendezvous import disk_room
from rendezvous.checkpoint_claim import CheckpointDirInUseError, FolderClaim
from rendezvous.checkpoint_owner import Claimant
from rendezvous.private_dir import InsecureDirectoryError, make_private_dir


def claim_checkpoint_dirs(config: JobConfig) -> tuple[JobConfig, list[FolderClaim], list[str]]:
    """Take ``config``'s checkpoint folders for its job, ``--checkpoint-dir`` and the
    parameter servers' ``--ps-checkpoint-dir`` (each job's state is in both: a second
    job on either would load, or prune, the first one's): the config to run (its job id
    the first folder's when none was given), the holds (none without a folder), and the
    notes to say (a folder taken over from a job that is gone).

    Raises:
        UsageError: a folder is another live job's, a live driver of this job that
            cannot share it holds it, or its owner files cannot be read or written
            (one line naming the flag and the folder); nothing is held then.
    """
    holds: list[FolderClaim] = []
    notes: list[str] = []
    taken: set[str] = set()
    given = config.job_id_given
    try:
        for flag, directory in (
            ("--checkpoint-dir", config.checkpoint_dir),
            ("--ps-checkpoint-dir", config.ps_checkpoint_dir),
        ):
            if not directory or os.path.realpath(directory) in taken:
                continue
            taken.add(os.path.realpath(directory))
            try:
                hold, job_id, note = _claim(config, flag, directory, given)
            except _DiskFull as full:
                if flag != "--ps-checkpoint-dir":
                    raise UsageError(str(full)) from None
                # The shards say a full disk and write again once there is room
                # (``ps.shard.checkpoint``): a job may start on one, unrecorded.
                notes.append(f"{full}; the job starts without recording itself as its owner")
                continue
            holds.append(hold)
            if note:
                notes.append(note)
            if job_id != config.job_id:
                config = dataclasses.replace(config, job_id=job_id)
            given = True  # (the next folder is this job's, or another's)
    except UsageError:
        for hold in holds:
            hold.close()
        raise
    return config, holds, notes


def _claim(
    config: JobConfig, flag: str, directory: str, given: bool
) -> tuple[FolderClaim, str, str]:
    """Take ``directory`` (``flag``'s) for ``config``'s job: the hold, the job id to run
    (the folder's when the job's was not ``given``) and the note to say.

    Raises:
        UsageError: see ``claim_checkpoint_dirs``.
        _DiskFull: the disk refused the owner record for want of space.
    """
    me = Claimant(
        job_id=config.job_id,
        host=socket.gethostname(),
        given=given,
        # Another driver of the same job may live beside this one: a --standby or a
        # successor (etcd), a --join node. With the embedded store the driver is the
        # job: a second one would be a second job on the same snapshots.
        shared=config.join is not None or config.rendezvous.scheme != DEFAULT_RENDEZVOUS,
        flag=flag,
    )
    try:
        make_private_dir(directory, flag)  # (the shards would make it: the owner files first)
        hold, verdict = FolderClaim.claim(directory, me)
    except (CheckpointDirInUseError, InsecureDirectoryError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        why = f"{flag} {directory}: cannot record this job as its owner: {exc.strerror or exc}"
        if disk_room.is_no_space(exc):
            raise _DiskFull(why) from None
        raise UsageError(why) from None
    return hold, verdict.job_id, verdict.why


class _DiskFull(Exception):
    """The folder's disk has no room for the owner record (the line to say)."""


def newest_snapshot(directory: str, job_id: str) -> int | None:
    """The step of job ``job_id``'s newest complete snapshot in ``directory`` (or in a
    host's own folder in it) that this host can see; None for none. Read from the
    folder itself: a snapshot written while the store was away was never announced."""
    from elastic.snapshots import files  # (the manifests' format; only at a job's end)

    steps = [
        manifest.step
        for root in files.roots(directory)
        for manifest, _ in files.complete(root)
        if manifest.job_id == job_id
    ]
    return max(steps, default=None)
