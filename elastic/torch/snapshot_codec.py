"""Torch tensors in snapshots (``elastic.snapshots.codec``): their raw bytes apart from the
pickled skeleton, written in parts like numpy arrays. A tensor on a GPU is copied to
the host by the snapshot's thread, never the training one; it comes back on the CPU,
and ``TorchState`` copies it where its module or optimizer keeps it."""

from __future__ import annotations

import torch

from elastic.snapshots.codec import register_leaf_codec


def _encode(tensor: torch.Tensor) -> tuple[dict, memoryview]:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    meta = {"dtype": str(flat.dtype).removeprefix("torch."), "shape": list(tensor.shape)}
    return meta, memoryview(flat.view(torch.uint8).numpy().data)


def _decode(meta: dict, buffer: bytearray) -> torch.Tensor:
    dtype = getattr(torch, meta["dtype"])
    if not buffer:
        return torch.empty(meta["shape"], dtype=dtype)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(meta["shape"])


register_leaf_codec("torch", torch.Tensor, _encode, _decode)
