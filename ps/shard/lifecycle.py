"""A primary's start and stop among the other shards: the state it restores when it
starts (``restore``), saying so when that state is older than the step the other shards
had reached, and the checkpoint that seals the shards' state when it stops (``finish``).

A restore (a start, or a restart by the driver):

* sync: shard 0 brings every shard to the newest complete checkpoint (its own start, or
  ``RestoreAll`` from a restarted shard; ``coordinator.py``), and itself reports a
  rollback when a shard had gone past that checkpoint;
* async, or when shard 0 did not answer: the shard loads the newest complete checkpoint
  alone. In async mode it then continues the others' step count; when they had gone
  past the step it loaded, the updates of the steps between are lost on this shard, and
  it reports that as a rollback (``on_rollback``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable

from ps.errors import PSError
from ps.protocol import RESTORE_ALL, SEAL, STATUS, Empty
from ps.settings import ServerSettings
from ps.shard.checkpoint import load_newest
from ps.shard.control import Peers
from ps.shard.coordinator import Coordinator
from ps.shard.state import ShardState, initial_generation
from rendezvous.errors import RendezvousError
from rendezvous.schema.ps import RollbackRecord

log = logging.getLogger("ps.shard.server")


def restore(
    s: ServerSettings,
    state: ShardState,
    coordinator: Coordinator | None,
    peers: Peers | None,
    on_rollback: Callable[[RollbackRecord], None],
) -> None:
    """Restore ``state`` for this start (see the module doc). Raises PSCheckpointError
    only if a checkpoint disappears between verification and reading."""
    if s.mode == "sync":
        if coordinator is not None:
            coordinator.restore_all()
        elif peers is not None:
            try:
                peers.call(0, RESTORE_ALL, Empty(), retry_for=s.peer_deadline)
            except PSError as exc:
                log.warning("shard 0 did not restore the shards (%s); loading alone", exc)
    cid = None
    if not state.loaded:
        loaded = load_newest(s.checkpoint_dir)
        snap = loaded.shard_snapshot(s.index, s.num_shards, s.split_threshold) if loaded else None
        cid = loaded.checkpoint_id if loaded else None
        state.load(snap, cid, initial_generation(cid))
        if loaded:
            log.info("shard %d: loaded checkpoint %d (step %d)", s.index, cid, loaded.step)
    if s.mode == "async" and peers is not None:
        # Continue the others' step count (best effort, one attempt each: at a job's
        # start the peers may not be up, and then they are at this same step anyway).
        steps = []
        for i in range(s.num_shards):
            if i != s.index:
                with contextlib.suppress(PSError):
                    steps.append(peers.call(i, STATUS, Empty(), retry_for=0.0).step)
        if steps and max(steps) > state.step:
            on_rollback(RollbackRecord(s.index, max(steps), state.step, cid))
        if steps:
            state.raise_step(max(steps))


def finish(
    s: ServerSettings, state: ShardState, coordinator: Coordinator | None, peers: Peers | None
) -> None:
    """Before the shard stops: put the shards' state in a checkpoint that seals them
    (``Coordinator.seal``: no push is applied after it, so it holds the last step any
    client saw), when the job checkpoints at all. Shard 0 makes it and announces it as
    the final checkpoint. Another shard cannot make a coordinated checkpoint alone: it
    asks shard 0 for one, unless a seal already holds it (the driver stops shard 0
    first, whose final checkpoint seals every shard), and without an answer it stops
    with what the newest checkpoint holds. Bounded by ``ServerSettings.stop_timeout``;
    the outcome is logged."""
    if not s.checkpoint_dir or not state.loaded:
        return
    deadline = time.monotonic() + s.stop_timeout
    if coordinator is not None:
        manifest = coordinator.seal(deadline, final=True)
        if manifest is not None:
            log.info("final checkpoint %d holds step %d", manifest.checkpoint_id, manifest.step)
        return
    sealed = state.sealed_at()
    if sealed is None and peers is not None:
        try:
            reply = peers.call(0, SEAL, Empty(), retry_for=0.0, timeout=s.stop_timeout)
            sealed = reply.checkpoint_id
        except (PSError, RendezvousError) as exc:
            log.warning("shard 0 made no checkpoint for this stop: %s", exc)
            sealed = state.sealed_at()  # it may have, and then stopped itself
    if sealed is not None:
        log.info("shard %d: stopping with its state in checkpoint %d", s.index, sealed)
    else:
        log.warning(
            "shard %d stops with changes since the newest checkpoint; a restart "
            "restores that checkpoint",
            s.index,
        )
