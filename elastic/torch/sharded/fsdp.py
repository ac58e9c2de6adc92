"""``fully_shard`` on the job's world, and the re-cut of a sharded module onto a new
round's world that keeps its ``Parameter`` objects.

``fully_shard(module, **kwargs)`` is FSDP2's, on the mesh of the current round
(``group.install``), with gradients summed rather than averaged (the weights of
``ElasticSampler(global_batch_size=B).steps()`` make the sum one process's update).

``recut(root, mesh, full)`` re-shards every FSDP2 parameter group under ``root`` onto
``mesh`` from the full values ``full`` (by parameter name). FSDP2 cuts a parameter in
``FSDPParam._init_sharded_param``; running it again on the full value and the new
mesh gives a new ``DTensor`` parameter, whose local shard and spec are then moved into
the *old* parameter object, which is put back on the module. So the optimizer, the
scheduler and every reference the script holds go on with the same objects. This
touches FSDP2 internals of torch 2.13 (``_fsdp_param_group``, ``FSDPParam``): the one
place that does, so the one place to follow torch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import fully_shard as _fsdp_fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_init import (
    _get_mesh_info,
    _get_post_forward_mesh_info,
)
from torch.distributed.tensor import DTensor

from elastic.torch import plane
from elastic.torch.plane.choice import RING
from elastic.torch.sharded.group import LAYOUT_KEY, install

#: the attribute a sharded root carries: the round its shards were cut for
LAYOUT_ATTR = "_elastic_layout_round"


def round_mesh(device_type: str = "cpu") -> DeviceMesh:
    """The current round's mesh for tensors on ``device_type``: the plane's group for
    them, or, where they go through the ring, gloo (CPU) or NCCL (CUDA).

    Raises WorkerLostError (the round is re-forming), ElasticError (outside
    elastic-run), BackendUnavailableError."""
    name = plane.plane(device_type)
    if name == RING:
        name = "nccl" if device_type == "cuda" else "gloo"
    return install(plane._groups.group(name))


def fully_shard(module: nn.Module, **kwargs: Any) -> nn.Module:
    """FSDP2's ``fully_shard(module, **kwargs)`` on the job's current round (any
    ``mesh=`` given is refused: the job's world is the mesh). Call it per block, then on
    the root, as with FSDP2; gradients are summed across the world.

    Raises ValueError for ``mesh=``; WorkerLostError when the round re-forms meanwhile."""
    if "mesh" in kwargs:
        raise ValueError("et.fully_shard shards on the job's world: leave out mesh=")
    device_type = _device_type(module)
    mesh = round_mesh(device_type)
    sharded = _fsdp_fully_shard(module, mesh=mesh, **kwargs)
    assert isinstance(sharded, FSDPModule)
    sharded.set_gradient_divide_factor(1.0)
    sharded.set_force_sum_reduction_for_comms(True)
    setattr(module, LAYOUT_ATTR, _mesh_key(mesh))
    return module


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module`` holds parameters FSDP2 sharded (DTensors)."""
    return any(isinstance(p, DTensor) for p in module.parameters())


def _device_type(module: nn.Module) -> str:
    for p in module.parameters():
        return p.device.type
    return "cpu"


def _mesh_key(mesh: DeviceMesh) -> str:
    return str(getattr(mesh, LAYOUT_KEY))


def layout_of(module: nn.Module) -> str | None:
    """The round group the shards of ``module`` are cut for (``fully_shard``, ``recut``)."""
    return getattr(module, LAYOUT_ATTR, None)


def _param_groups(root: nn.Module) -> list[Any]:
    groups = []
    for sub in root.modules():
        if isinstance(sub, FSDPModule):
            group = sub._get_fsdp_state()._fsdp_param_group
            if group is not None:
                groups.append(group)
    return groups


def settle(root: nn.Module) -> None:
    """Put the FSDP2 modules under ``root`` back to a clean, sharded state (no
    collective): a step cut short by a failure leaves collectives in flight (an
    all-gather prefetched in backward), the root's final-callback flag set and its
    parameters unsharded. The works in flight belong to the round that ended and are
    dropped unwaited (an abandoned gloo collective writes only into its own buffers),
    then FSDP2's own recovery, ``reset_iter_state``, runs from the root."""
    for sub in root.modules():
        if isinstance(sub, FSDPModule):
            for group in sub._get_fsdp_state()._fsdp_param_groups:
                group._all_gather_result = None
                for fsdp_param in group.fsdp_params:
                    fsdp_param.unsharded_accumulated_grad = None
    if isinstance(root, FSDPModule) and root._get_fsdp_state()._is_root:
        root.reset_iter_state()
    for sub in root.modules():
        if isinstance(sub, FSDPModule):
            sub.reshard()
            for group in sub._get_fsdp_state()._fsdp_param_groups:
                for fsdp_param in group.fsdp_params:
                    fsdp_param.sharded_param.grad = None


@torch.no_grad()
def recut(root: nn.Module, mesh: DeviceMesh, full: dict[str, torch.Tensor]) -> None:
    """Re-shard the parameters of ``root`` onto ``mesh`` from ``full`` (each sharded
    parameter's full value by its name in ``root``), in place (module docstring).

    Raises KeyError when ``full`` lacks a sharded parameter."""
    settle(root)
    names = {id(p): name for name, p in root.named_parameters()}
    mesh_info = _get_mesh_info(mesh, None)
    for group in _param_groups(root):
        post = (
            None
            if group.post_forward_mesh_info is None
            else _get_post_forward_mesh_info(True, mesh_info)  # type: ignore[arg-type]
        )
        group.mesh_info, group.post_forward_mesh_info = mesh_info, post
        for fsdp_param in group.fsdp_params:
            old = fsdp_param.sharded_param
            value = full[names[id(old)]]
            old.grad = None
            fsdp_param.post_forward_mesh_info = post
            fsdp_param.all_gather_outputs = []
            if hasattr(fsdp_param, "_unsharded_param"):
                del fsdp_param._unsharded_param
            fresh = nn.Parameter(value.to(old.device, old.dtype), requires_grad=old.requires_grad)
            fsdp_param._init_sharded_param(fresh, fsdp_param.device, None, mesh_info)
            if post is not None:
                fsdp_param._init_sharded_post_forward_param_metadata(fresh)
            new = fsdp_param.sharded_param
            old._local_tensor, old._spec = new._local_tensor, new._spec
            fsdp_param.sharded_param = old
            fsdp_param._setattr_on_modules(old)
    setattr(root, LAYOUT_ATTR, _mesh_key(mesh))


def shard_like(param: Any, full: torch.Tensor) -> DTensor:
    """``full`` (a tensor of ``param``'s global shape) cut as ``param`` is cut now."""
    chunks = torch.chunk(full, param.device_mesh.size(), dim=0)
    rank = param.device_mesh.get_local_rank()
    empty = full.new_empty((0, *full.shape[1:]))
    return shard_of(param, chunks[rank].clone() if rank < len(chunks) else empty)


def shard_of(param: Any, local: torch.Tensor) -> DTensor:
    """``local`` as this worker's shard of a tensor cut as ``param`` is."""
    return DTensor.from_local(
        local,
        param.device_mesh,
        param.placements,
        run_check=False,
        shape=param.shape,
        stride=param.stride(),
    )
