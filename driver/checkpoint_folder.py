"""The driver's claim on its ``--checkpoint-dir`` at the start: one job per checkpoint
folder (``rendezvous.checkpoint_owner``). A second job on a folder in use is refused
(a usage error: one line naming the folder and the job that holds it, exit 2); a job
started without ``--job-id`` on a folder is the folder's job (the same command started
again resumes it); the hold lasts as long as the driver (``FolderClaim``)."""

from __future__ import annotations

import dataclasses
import socket

from driver.config import JobConfig
from driver.errors import UsageError
from driver.flags import DEFAULT_RENDEZVOUS
from rendezvous.checkpoint_claim import CheckpointDirInUseError, FolderClaim
from rendezvous.checkpoint_owner import Claimant


def claim_checkpoint_dir(config: JobConfig) -> tuple[JobConfig, FolderClaim | None, str]:
    """Take ``config``'s checkpoint folder for its job: the config to run (its job id
    the folder's when none was given), the hold (None without ``--checkpoint-dir``),
    and a note to say ("" for none: a folder taken over from a job that is gone).

    Raises:
        UsageError: the folder is another live job's, a live driver of this job that
            cannot share it holds it, or its owner files cannot be read or written
            (one line naming the folder).
    """
    if not config.checkpoint_dir:
        return config, None, ""
    me = Claimant(
        job_id=config.job_id,
        host=socket.gethostname(),
        given=config.job_id_given,
        # Another driver of the same job may live beside this one: a --standby or a
        # successor (etcd), a --join node. With the embedded store the driver is the
        # job: a second one would be a second job on the same snapshots.
        shared=config.join is not None or config.rendezvous.scheme != DEFAULT_RENDEZVOUS,
    )
    try:
        hold, verdict = FolderClaim.claim(config.checkpoint_dir, me)
    except CheckpointDirInUseError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(
            f"--checkpoint-dir {config.checkpoint_dir}: cannot record this job as its "
            f"owner: {exc.strerror or exc}"
        ) from None
    if verdict.job_id != config.job_id:
        config = dataclasses.replace(config, job_id=verdict.job_id)
    return config, hold, verdict.why


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
