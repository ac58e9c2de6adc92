"""Leases that lapse because the store stalled, not because their holder went.

etcd expires a lease whose TTL passed while it could not be refreshed, and a store
that was stopped for longer than a TTL (a leader election, a disk stall, SIGSTOP)
expires every lease of the job the moment it answers again: the agents' records and
the workers' registrations vanish together although every host is fine. Their agents
take a new lease then and write them again within a second or two
(``driver.agent.loop``); the driver waits ``RETURN_GRACE``
(``rendezvous.schema.agents``) for that
(``driver.launch.assignments.launcher``, ``driver.job.handlers``) when the store was in
trouble just before (``lapse_explained``; what the probe saw:
``driver.job.store_trouble``), instead of taking every host as lost. A host that is
really cut off meanwhile is found by its ring peers' reports, which do not wait.
"""

from __future__ import annotations

from driver.policy.memory.progress import SnapshotHeld
from rendezvous.schema.agents import AGENT_LEASE_TTL

LAPSE_WINDOW = AGENT_LEASE_TTL + 5.0
"""Seconds after the store was last in trouble within which a lapsed lease may be the
store's doing (the agent's TTL, and the probe's interval with its timeout)."""


def lapse_explained(trouble_at: float | None, now: float, window: float = LAPSE_WINDOW) -> bool:
    """Whether a lease that lapsed at ``now`` may be the store's doing: the store was in
    trouble (``trouble_at``, its latest moment) within ``window`` seconds before."""
    return trouble_at is not None and now - trouble_at <= window


def store_lost_line(
    reason: str,
    progress_step: int | None,
    snapshots: tuple[SnapshotHeld, ...],
    checkpoint_dir: str | None,
    on_disk: int | None = None,
) -> str:
    """The line a job ends with when its store stayed away past ``--elastic-timeout``
    (``reason``: for how long, and the last error): the newest commit the driver heard
    of, and what of it stands on disk: the newest snapshot the driver heard of, or
    ``on_disk``, the newest it found in the folder (while the store is away, rank 0
    writes the snapshots alone and cannot announce them,
    ``elastic.snapshots.snapshotter``)."""
    heard = f"; the newest step heard committed was {progress_step}" if progress_step else ""
    steps = [held.step for held in snapshots] + ([on_disk] if on_disk is not None else [])
    if not checkpoint_dir:
        kept = "; there is no --checkpoint-dir, so nothing of the state is kept"
    elif steps:
        step = max(steps)
        kept = (
            f"; the newest snapshot, of step {step}, stands in --checkpoint-dir "
            f"{checkpoint_dir}: the same command resumes from it"
        )
    else:
        kept = f"; no snapshot was completed yet in --checkpoint-dir {checkpoint_dir}"
    return f"lost the rendezvous store: {reason}{heard}{kept}"
