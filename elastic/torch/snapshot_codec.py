"""Torch tensors in snapshots (``elastic.snapshots.codec``): their raw bytes apart from the
pickled skeleton, written in parts like numpy arrays. A tensor in host memory is read
in place; one on a GPU is copied to the host a piece at a time, each piece by the
snapshot thread of the worker that writes it (never the training thread, never the
whole state by every worker). It comes back on the CPU, and ``TorchState`` copies it
where its module or optimizer keeps it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from elastic.snapshots.codec import HostBytes, LeafBytes, register_leaf_codec


@dataclass(frozen=True)
class DeviceBytes:
    """The raw bytes of a flat tensor on a device, copied to the host a range at a time."""

    flat: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def read(self, start: int, stop: int) -> memoryview:
        size = self.flat.element_size()
        first, last = start // size, -(-stop // size)  # the elements that hold the range
        host = self.flat[first:last].to("cpu").view(torch.uint8).numpy()
        offset = first * size
        return memoryview(host.data)[start - offset : stop - offset]


def _encode(tensor: torch.Tensor) -> tuple[dict, LeafBytes]:
    flat = tensor.detach().contiguous().reshape(-1)
    meta = {"dtype": str(flat.dtype).removeprefix("torch."), "shape": list(tensor.shape)}
    if flat.device.type == "cpu":
        return meta, HostBytes(memoryview(flat.view(torch.uint8).numpy().data))
    return meta, DeviceBytes(flat)


def _decode(meta: dict, buffer: bytearray) -> torch.Tensor:
    dtype = getattr(torch, meta["dtype"])
    if not buffer:
        return torch.empty(meta["shape"], dtype=dtype)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(meta["shape"])


register_leaf_codec("torch", torch.Tensor, _encode, _decode)
