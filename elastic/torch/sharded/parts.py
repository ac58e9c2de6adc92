"""``ShardedParts``: the sharded modules and optimizers of a ``TorchState``: their
commits kept in host memory, mirrored, and adopted by a new round, resharded in place.

A commit copies this worker's *part* (the local shards of every sharded parameter and
of the optimizer state built on them) and the replicated rest (buffers, step counts,
hyper-parameters, and the ``TorchState``'s other attributes as it saved them), keeps it
with the one before (``KEEP``), and hands it to the mirror sender.

A new round's sync (``sync``):

1. every member reports what it holds (``layout.Holding``) and its mirror's address;
2. ``layout.choose`` picks the newest commit whose every part is held somewhere;
   none: ``ShardedStateLostError``, naming the step;
3. everything in place (the same cut, nobody lost): each member loads its own part,
   nothing travels; else each part is broadcast by who holds it (its owner, else its
   mirror), every member joins the parts into full values and cuts its own shard of the
   new world: ``fsdp.recut`` for the parameters (the same ``Parameter`` objects), a
   new ``DTensor`` for each optimizer slot; the replicated rest comes from one member.

So a lost worker costs a broadcast of the state (each member holds the full state for
the re-cut, transiently), no disk and no restart.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from elastic import context
from elastic.errors import ElasticError, ShardedStateLostError
from elastic.torch import _backend
from elastic.torch.params import broadcast_state_dict
from elastic.torch.sharded import fsdp
from elastic.torch.sharded.layout import Choice, Holding, Lost, choose, mirror_holder
from elastic.torch.sharded.mirror import KEEP, MirrorSender, MirrorServer

log = logging.getLogger(__name__)


@dataclass
class Version:
    """One commit of this worker's part: ``parts`` (local shards by key), ``rest``
    (the replicated state of the sharded objects) and ``saved`` (the state's others)."""

    commit: int
    layout: str
    rank: int
    size: int
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    rest: dict[str, Any] = field(default_factory=dict)
    saved: dict[str, Any] = field(default_factory=dict)


def _params(optimizer: torch.optim.Optimizer) -> list[nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def is_sharded_optimizer(value: Any) -> bool:
    """Whether ``value`` is an optimizer over DTensor parameters."""
    return isinstance(value, torch.optim.Optimizer) and any(
        isinstance(p, DTensor) for p in _params(value)
    )


def _copy(before: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    value = value.detach()
    if before is not None and before.shape == value.shape and before.dtype == value.dtype:
        return before.copy_(value)
    return value.clone()


class ShardedParts:
    """The sharded objects of a state: ``modules`` and ``optimizers`` by attribute."""

    def __init__(self, modules: dict[str, nn.Module], optimizers: dict[str, torch.optim.Optimizer]):
        self.modules, self.optimizers = modules, optimizers
        self.names = frozenset(modules) | frozenset(optimizers)
        self.versions: list[Version] = []
        self._server: MirrorServer | None = None
        self._sender: MirrorSender | None = None
        self._mirror_to: str | None = None

    # ---- this worker's part ----
    def _layout(self) -> tuple[str, int, int]:
        module = next(iter(self.modules.values()))
        layout = fsdp.layout_of(module) or "none"
        for p in module.parameters():
            if isinstance(p, DTensor):
                mesh = p.device_mesh
                return layout, mesh.get_local_rank(), mesh.size()
        return layout, 0, 1

    def _capture(self, into: Version | None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        before = into.parts if into is not None else {}
        parts: dict[str, torch.Tensor] = {}
        rest: dict[str, Any] = {}
        for name, module in self.modules.items():
            for fqn, p in module.named_parameters():
                if isinstance(p, DTensor):
                    key = f"{name}.{fqn}"
                    parts[key] = _copy(before.get(key), p._local_tensor)
            rest[name] = {fqn: b.detach().clone() for fqn, b in module.named_buffers()}
        for name, opt in self.optimizers.items():
            scalars: dict[int, dict[str, Any]] = {}
            for i, p in enumerate(_params(opt)):
                for slot, value in opt.state.get(p, {}).items():
                    if isinstance(value, DTensor):
                        key = f"{name}#{i}#{slot}"
                        parts[key] = _copy(before.get(key), value._local_tensor)
                    else:
                        v = value.detach().clone() if isinstance(value, torch.Tensor) else value
                        scalars.setdefault(i, {})[slot] = v
            groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
            rest[name] = {"groups": groups, "scalars": scalars}
        return parts, rest

    def save(self, commit: int, saved: dict[str, Any]) -> None:
        """Keep this worker's part as commit ``commit`` (``saved``: the state's other
        attributes as saved, kept as they are: a new dict each save), and mirror it."""
        if self._sender is not None:
            self._sender.wait()  # the oldest version's tensors are sent: reuse them
        layout, rank, size = self._layout()
        keep = [v for v in self.versions if v.commit != commit and v.layout == layout]
        reuse = keep[0] if len(keep) >= KEEP else None
        parts, rest = self._capture(reuse)
        version = Version(commit, layout, rank, size, parts, rest, saved)
        self.versions = [*keep[-(KEEP - 1) :], version]
        if self._sender is not None and self._mirror_to is not None:
            self._sender.send(self._mirror_to, (layout, rank, commit, self._message(version)))

    @staticmethod
    def _message(version: Version) -> dict[str, Any]:
        return {"parts": version.parts, "rest": version.rest, "saved": version.saved}

    def latest(self) -> Version:
        return self.versions[-1]

    @torch.no_grad()
    def load_own(self, version: Version) -> None:
        """Put ``version`` (this worker's, of the current cut) back into the objects."""
        for module in self.modules.values():
            fsdp.settle(module)
        for name, module in self.modules.items():
            for fqn, p in module.named_parameters():
                if isinstance(p, DTensor):
                    p._local_tensor.copy_(version.parts[f"{name}.{fqn}"])
                    p.grad = None
        for name, opt in self.optimizers.items():
            for i, p in enumerate(_params(opt)):
                prefix = f"{name}#{i}#"
                opt.state.pop(p, None)
                for key, local in version.parts.items():
                    if key.startswith(prefix):
                        opt.state[p][key[len(prefix) :]] = fsdp.shard_of(p, local.clone())
        self._load_rest(version.rest)

    @torch.no_grad()
    def _load_rest(self, rest: dict[str, Any]) -> None:
        for name, module in self.modules.items():
            buffers = dict(module.named_buffers())
            for fqn, value in rest.get(name, {}).items():
                buffers[fqn].copy_(value)
        for name, opt in self.optimizers.items():
            record = rest.get(name)
            if record is None:
                continue
            for group, saved in zip(opt.param_groups, record["groups"]):
                group.update(saved)
            params = _params(opt)
            for i, slots in record["scalars"].items():
                for slot, value in slots.items():
                    v = value.clone() if isinstance(value, torch.Tensor) else value
                    opt.state[params[i]][slot] = v

    # ---- a new round ----
    def _start_mirror(self) -> MirrorServer:
        if self._server is None:
            runtime = context.current_runtime()
            if runtime is None:
                raise ElasticError("a sharded state needs a job run by elastic-run")
            secret = runtime.settings.secret.encode()
            self._server = MirrorServer(runtime.settings.bind_host, secret)
            self._sender = MirrorSender(secret)
        return self._server

    def sync(self) -> Version:
        """Adopt the newest commit every part of which is held (module docstring); the
        version adopted (its ``saved``: the state's other attributes to restore).

        Raises ShardedStateLostError (a part and its mirror lost together),
        WorkerLostError (the round breaks meanwhile)."""
        server = self._start_mirror()
        if self._sender is not None:
            self._sender.wait()
        device_type = next(iter(self.modules.values())).parameters().__next__().device.type
        mesh = fsdp.round_mesh(device_type)
        mine = self.latest()
        holding = Holding(
            mine.layout,
            mine.size,
            mine.rank,
            tuple(v.commit for v in self.versions),
            tuple(server.held()),
        )
        runtime = context.current_runtime()
        host = runtime.settings.bind_host if runtime is not None else "?"
        reports = _backend.allgather_object((holding, server.address, host))
        rank = _backend.world_rank()
        holder = mirror_holder(rank, [r[2] for r in reports])
        self._mirror_to = reports[holder][1] if holder is not None else None
        choice = choose([r[0] for r in reports], fsdp._mesh_key(mesh))
        if isinstance(choice, Lost):
            raise ShardedStateLostError(
                f"a part of the sharded state and its mirror are lost together (parts "
                f"{list(choice.missing)}); the newest committed step, {choice.newest}, "
                "cannot be rebuilt in memory"
            )
        log.info(
            "sharded state: commit %d of layout %s (%d parts) %s",
            choice.commit,
            choice.layout,
            choice.size,
            "in place" if choice.in_place else "resharded onto this round",
        )
        if choice.in_place:
            version = next(v for v in self.versions if v.commit == choice.commit)
            self.load_own(version)
        else:
            version = self._reshard(choice, mesh, rank)
        self.versions = [version]
        server.keep_only(version.layout)
        return version

    def _part(self, choice: Choice, r: int) -> dict[str, Any]:
        for v in self.versions:
            if v.layout == choice.layout and v.rank == r and v.commit == choice.commit:
                return self._message(v)
        assert self._server is not None
        return self._server.part(choice.layout, r, choice.commit)

    def _reshard(self, choice: Choice, mesh: Any, rank: int) -> Version:
        pieces: dict[str, list[torch.Tensor]] = {}
        chosen: dict[str, Any] = {}
        for r, sender in enumerate(choice.senders):
            message = broadcast_state_dict(
                self._part(choice, r) if sender == rank else None, sender
            )
            for key, local in message["parts"].items():
                pieces.setdefault(key, []).append(local)
            if r == 0:  # the rest is the same in every part of a commit
                chosen = message
        full = {key: torch.cat(locals_, dim=0) for key, locals_ in pieces.items()}
        for name, module in self.modules.items():
            prefix = f"{name}."
            fsdp.recut(
                module, mesh, {k[len(prefix) :]: v for k, v in full.items() if k.startswith(prefix)}
            )
        for name, opt in self.optimizers.items():
            params = _params(opt)
            opt.state.clear()
            for key, value in full.items():
                owner, _, place = key.partition("#")
                if owner == name:
                    index, _, slot = place.partition("#")
                    p = params[int(index)]
                    opt.state[p][slot] = fsdp.shard_like(p, value)
        self._load_rest(chosen["rest"])
        layout, new_rank, size = self._layout()
        parts, rest = self._capture(None)
        return Version(choice.commit, layout, new_rank, size, parts, rest, chosen["saved"])
