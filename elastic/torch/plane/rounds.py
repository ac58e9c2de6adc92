"""``RoundGroups``: this process's process group of the current round, built at the
round's first collective on the plane and retired when the round ends.

A round is its ring communicator (``WorkerRuntime.comm``): a new one means a new round
(or a re-formed one), so the group of the old one is aborted and a new group formed
under the new round's prefix. Building at the first use rather than when the round
forms keeps ``elastic`` free of torch, and puts the build where every member is anyway:
the round's sync, whose broadcasts all members run. A newcomer is in a round once it
registered, which ``elastic.torch.init`` does after CUDA started, so no round waits on a
newcomer's CUDA start.

A retired group is aborted (a gloo one is then kept for the life of the process:
``backends``). Rank 0 of each new group deletes the store keys of older rounds' groups,
off the training thread.
"""

from __future__ import annotations

import logging
import threading

from elastic.comm import CommSettings
from elastic.context import current_runtime
from elastic.errors import ElasticError, WorkerLostError
from elastic.torch.plane.backends import BACKENDS, GroupSettings
from elastic.torch.plane.group import RoundGroup
from rendezvous.keys import JobKeys
from rendezvous.store import KVStore

log = logging.getLogger(__name__)

#: the shortest last-resort timeout of one collective (``GroupSettings.op_timeout``)
OP_TIMEOUT_FLOOR = 60.0


def group_settings(comm: CommSettings, bind_host: str) -> GroupSettings:
    """A round's group settings from its ring's: it forms within the ring's connect
    timeout, and torch's own collective timeout (a last resort: the ring sees a loss
    first) is well beyond the ring's peer timeout."""
    return GroupSettings(
        connect_timeout=comm.connect_timeout,
        op_timeout=max(OP_TIMEOUT_FLOOR, 4 * comm.peer_timeout),
        bind_host=bind_host,
    )


def stale_rounds(keys: list[str], groups_prefix: str, current: int) -> list[int]:
    """The rounds older than ``current`` that still have keys among ``keys`` (pure)."""
    rounds = set()
    for key in keys:
        head = key[len(groups_prefix) :].split("/", 1)[0]
        if key.startswith(groups_prefix) and head.isdigit() and int(head) < current:
            rounds.add(int(head))
    return sorted(rounds)


class RoundGroups:
    """The current round's group (one at a time: one backend per process setting)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: RoundGroup | None = None

    def group(self, backend: str) -> RoundGroup:
        """The group of backend ``backend`` ("gloo", "nccl") of the current round,
        formed now if this is the round's first use (every member gets here at the same
        point of the program).

        Raises WorkerLostError when the round is over or re-forming, or its group cannot
        form; ElasticError outside an elastic-run job."""
        runtime = current_runtime()
        if runtime is None or runtime.store is None:
            raise ElasticError("a process group plane needs a job run by elastic-run")
        comm = runtime.comm
        if comm is None:
            raise WorkerLostError("no communicator: the round is re-forming")
        with self._lock:
            current = self._current
            if current is not None and current.ring is comm and current.backend.name == backend:
                if current.aborted:
                    raise current.error()
                return current
            self._current = None
            if current is not None:
                current.abort("the round ended")
            round_id = getattr(comm, "round_id", runtime.round_id)
            group = RoundGroup(
                BACKENDS[backend](),
                runtime.store,
                runtime.keys.torch_group(round_id),
                comm,
                round_id,
                group_settings(runtime.settings.comm, runtime.settings.bind_host),
            )
            self._current = group
        if group.rank == 0:
            threading.Thread(
                target=_delete_older_groups,
                args=(runtime.store, runtime.keys, round_id),
                name="elastic-group-keys",
                daemon=True,
            ).start()
        return group


def _delete_older_groups(kv: KVStore, keys: JobKeys, current: int) -> None:
    """Best effort: the keys of rounds before ``current`` (their groups are over)."""
    try:
        found, _ = kv.get_prefix(keys.torch_groups)
        for old in stale_rounds([kv.key for kv in found], keys.torch_groups, current):
            kv.delete_prefix(keys.torch_group(old))
    except ElasticError as exc:
        log.debug("older process groups' keys stay in the store: %s", exc)
