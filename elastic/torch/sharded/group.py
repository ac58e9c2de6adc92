"""The round's process group as FSDP2 and DTensor take one: a ``dist.ProcessGroup``
made the process's default group and wrapped in a one-dimensional ``DeviceMesh``.

FSDP2 runs its collectives itself (all-gathers in forward, reduce-scatters in
backward, DTensor's all-reduces for a gradient norm) and waits on them with
``Work.wait()``. On the round's gloo group such a wait does not end when a peer is
lost: gloo's ``abort()`` leaves it waiting on the peer (``plane.backends``). So the
group given to FSDP is ``AbortableGroup``, a Python ``ProcessGroup`` that starts each
collective on the round's backend and returns a ``Work`` whose ``wait`` is the round
group's own (``RoundGroup.wait_work``): it ends when the ring sees the loss and raises
``WorkerLostError``, and ``@elastic.run`` recovers as for any collective. Collectives
FSDP does not use go straight to the backend (registered for the device).

DeviceMesh reads the process's rank from the default group, so each round's group is
installed as the default (``install``), replacing the last round's.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh

from elastic.torch.plane.backends import _never_free
from elastic.torch.plane.group import RoundGroup


class _RoundWork(dist._Work):
    """One or more backend works, waited for through the round's group."""

    def __init__(self, group: RoundGroup, works: list[Any]):
        super().__init__()
        self._group = group
        self._works = works

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Raises WorkerLostError when the round ends first or a collective fails."""
        for work in self._works:
            self._group.wait_work(work)
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def is_success(self) -> bool:
        return self.is_completed()


class AbortableGroup(dist.ProcessGroup):
    """The collectives FSDP2 and DTensor run, on ``group``'s backend, with waits that
    end at the round's end (see the module docstring)."""

    def __init__(self, group: RoundGroup, name: str):
        super().__init__(group.rank, group.size)  # type: ignore[call-arg]
        self.round_group = group
        self._name = name
        self._inner = group.group
        device = group.backend.device()
        kind = (
            dist.ProcessGroup.BackendType.NCCL
            if device.type == "cuda"
            else dist.ProcessGroup.BackendType.GLOO
        )
        self._register_backend(device, kind, self._inner)  # type: ignore[arg-type]
        self._set_default_backend(kind)

    @property
    def group_name(self) -> str:  # type: ignore[override]
        return self._name

    def getBackendName(self) -> str:
        return self.round_group.backend.name

    def _work(self, launch: Any) -> _RoundWork:
        if self.round_group.aborted:
            raise self.round_group.error()
        try:
            works = launch()
        except Exception as exc:  # torch refuses: the group is broken
            self.round_group.abort(f"collective could not start: {exc}")
            raise self.round_group.error(1.0) from exc
        return _RoundWork(self.round_group, works if isinstance(works, list) else [works])

    # ---- what FSDP2 and DTensor call ----
    def all_gather_single(self, out, tensor, opts=None):
        return self._work(lambda: self._inner._allgather_base(out, tensor))

    def allgather_into_tensor_coalesced(self, outs, tensors, opts=None):
        return self._work(
            lambda: [self._inner._allgather_base(o, t) for o, t in zip(outs, tensors)]
        )

    def reduce_scatter_single(self, out, tensor, opts):
        return self._work(lambda: self._inner._reduce_scatter_base(out, tensor, opts))

    def reduce_scatter_tensor_coalesced(self, outs, tensors, opts):  # type: ignore[override]
        def launch():
            return [self._inner._reduce_scatter_base(o, t, opts) for o, t in zip(outs, tensors)]

        return self._work(launch)

    def allreduce(self, tensors, opts=None):  # type: ignore[override]
        if not isinstance(opts, dist.AllreduceOptions):
            options = dist.AllreduceOptions()
            if opts is not None:
                options.reduceOp = opts
            opts = options
        return self._work(lambda: self._inner.allreduce(tensors, opts))

    def broadcast(self, tensors, opts):  # type: ignore[override]
        return self._work(lambda: self._inner.broadcast(tensors, opts))

    def allgather(self, outs, tensors, opts=None):
        return self._work(lambda: self._inner.allgather(outs, tensors))


_lock = threading.Lock()
_installed: dict[int, tuple[RoundGroup, AbortableGroup, DeviceMesh]] = {}
_count = 0
#: the attribute of an installed mesh that names its layout, the same on every member
LAYOUT_KEY = "_elastic_layout"


def install(group: RoundGroup) -> DeviceMesh:
    """The mesh of ``group``'s round, its ``AbortableGroup`` made the default process
    group (once per round group; the last round's is forgotten)."""
    with _lock:
        found = _installed.get(id(group))
        if found is not None and found[0] is group:
            return found[2]
        global _count
        _count += 1
        name = f"elastic-round-{group.round_id}-{_count}"
        pg = AbortableGroup(group, name)
        world: Any = c10d._world
        world.pg_group_ranks[pg] = {i: i for i in range(group.size)}
        world.pg_map[pg] = (group.backend.name, None)
        world.pg_names[pg] = name
        c10d._register_process_group(name, pg)  # type: ignore[arg-type]
        c10d._update_default_pg(pg)
        # Like the aborted gloo group under it (``plane.backends``), never freed: its
        # destructor can wait on a collective abandoned with a lost peer.
        _never_free(pg)
        # A dimension named for the round: DeviceMesh compares by size and names, and
        # DTensor caches sharding decisions by mesh, so two rounds of one size would
        # otherwise share them, the old round's group with them.
        dim = f"round{group.round_id}_{_count}"
        mesh = DeviceMesh.from_group(pg, group.backend.device().type, mesh_dim_names=(dim,))
        setattr(mesh, LAYOUT_KEY, f"{group.round_id}/{group.size}")
        _installed.clear()
        _installed[id(group)] = (group, pg, mesh)
        return mesh


def device_of(mesh: DeviceMesh) -> torch.device:
    """Where the tensors of ``mesh``'s round live."""
    return torch.device(mesh.device_type)
