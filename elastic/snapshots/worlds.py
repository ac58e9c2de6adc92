"""The snapshots of each world a process can train in: a worker of an ``elastic-run`` job
(its rounds and its store, ``snapshots_of_job``) and a script that trains alone
(``snapshots_alone``). Under ``mpiexec`` there are none: its ranks have no store to
agree through."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from elastic.snapshots.coordination import LocalCoordination, StoreCoordination
from elastic.snapshots.settings import SnapshotSettings
from elastic.snapshots.snapshotter import Round, Snapshotter
from rendezvous.keys import JobKeys

if TYPE_CHECKING:
    from elastic.runtime import WorkerRuntime


def snapshots_of_job(runtime: WorkerRuntime) -> Snapshotter | None:
    """A worker's snapshots, when elastic-run gave it a checkpoint directory.

    Raises:
        RendezvousConfigError: ``ELASTIC_CHECKPOINT_*`` does not parse (named).
    """
    settings = SnapshotSettings.from_env()
    if settings is None:
        return None
    coordination = StoreCoordination(
        runtime.keys, lambda: runtime.store, runtime.settings.round_timeout
    )
    coordination.follow()

    def round_info() -> Round | None:
        plan, me = runtime.plan, runtime.member
        if plan is None or me is None:
            return None
        return Round(
            plan.round_id,
            me.rank,
            plan.size,
            me.local_rank,
            me.local_size,
            me.host,
            plan.snapshot,
            plan.snapshot_token,
        )

    return Snapshotter(
        settings,
        coordination,
        round_info,
        runtime.superseded,
        runtime.keys,
        store_away=runtime.store_reach.away_for,
    )


def snapshots_alone() -> Snapshotter | None:
    """A lone script's snapshots, when ``ELASTIC_CHECKPOINT_DIR`` is set.

    Raises:
        RendezvousConfigError: ``ELASTIC_CHECKPOINT_*`` does not parse (named).
    """
    settings = SnapshotSettings.from_env()
    if settings is None:
        return None
    host = socket.gethostname()
    alone = Round(round_id=1, rank=0, size=1, local_rank=0, local_size=1, host=host)
    return Snapshotter(
        settings, LocalCoordination(), lambda: alone, lambda _round: False, JobKeys("alone")
    )
