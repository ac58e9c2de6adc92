"""Moving tensors between torch and the numpy collectives without needless copies.

A contiguous CPU tensor and ``tensor.numpy()`` share memory, so a CPU tensor goes to the
transport as it is. A CUDA tensor cannot: it is copied to a page-locked (pinned) host
buffer, which the transport reads, and results are copied back. Pinned buffers are
kept per (shape, dtype) and reused, because pinning memory is slow.

Dtypes numpy lacks (bfloat16) travel as their bit pattern (int16) when only moved, and
as float32 when reduced.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

_BITS_FOR = {torch.bfloat16: torch.int16}


def transfer_view(t: torch.Tensor) -> np.ndarray:
    """The numpy array sharing ``t``'s memory, for moving bytes (``t``: contiguous, CPU).

    Raises ValueError for a tensor that is not contiguous or not on the CPU."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(
            f"need a contiguous CPU tensor, got {t.device} contiguous={t.is_contiguous()}"
        )
    t = t.detach()
    bits = _BITS_FOR.get(t.dtype)
    return (t.view(bits) if bits is not None else t).numpy()


def from_transfer(arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The tensor of ``dtype`` sharing ``arr``'s memory (inverse of ``transfer_view``)."""
    t = torch.from_numpy(arr)
    return t.view(dtype) if dtype in _BITS_FOR else t


def reduce_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` is reduced in (numpy must be able to add it)."""
    return torch.float32 if dtype in _BITS_FOR else dtype


class HostStaging:
    """Host copies of device tensors for the transport.

    ``is_device(t)`` says whether ``t`` needs staging (default: not on the CPU);
    ``synchronize(device)`` waits for queued copies on ``device`` (default: the current
    CUDA stream). Both are parameters so the staging logic is testable without a GPU.
    """

    def __init__(self, pin: bool | None = None, is_device=None, synchronize=None):
        self._pin = torch.cuda.is_available() if pin is None else pin
        self._is_device = is_device or (lambda t: t.device.type != "cpu")
        self._synchronize = synchronize or _cuda_synchronize
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._lock = threading.Lock()

    def needs_staging(self, t: torch.Tensor) -> bool:
        return bool(self._is_device(t))

    def buffer(self, shape: tuple[int, ...], dtype: torch.dtype, slot: int = 0) -> torch.Tensor:
        """A reusable host tensor (pinned when possible) of ``shape`` and ``dtype``;
        ``slot`` tells apart buffers in use at the same time."""
        key = (tuple(shape), dtype, slot)
        with self._lock:
            buf = self._buffers.get(key)
            if buf is None:
                buf = torch.empty(shape, dtype=dtype, pin_memory=self._pin)
                self._buffers[key] = buf
        return buf

    def to_host(self, t: torch.Tensor, slot: int = 0) -> torch.Tensor:
        """``t`` itself when it is a contiguous host tensor, else a host copy of it
        (staged through a reusable buffer for a device tensor)."""
        if not self.needs_staging(t):
            return t.detach().contiguous()
        buf = self.buffer(t.shape, t.dtype, slot)
        buf.copy_(t.detach(), non_blocking=True)
        self._synchronize(t.device)  # the transport reads buf from another engine
        return buf

    def to_device(self, host: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """A tensor on ``like``'s device holding ``host`` (``host`` itself on the CPU)."""
        if not self.needs_staging(like):
            return host
        out = torch.empty(host.shape, dtype=host.dtype, device=like.device)
        return self.copy_to(host, out)

    def copy_to(self, host: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Copy ``host`` into ``out`` (any device); returns ``out``."""
        out.copy_(
            host.view_as(out) if host.shape != out.shape else host,
            non_blocking=self.needs_staging(out),
        )
        if self.needs_staging(out):
            # The staging buffer may be reused by the next call: wait for the copy.
            self._synchronize(out.device)
        return out

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()


def _cuda_synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


_default: HostStaging | None = None


def default_staging() -> HostStaging:
    """The process's staging buffers (made at first use)."""
    global _default
    if _default is None:
        _default = HostStaging()
    return _default
