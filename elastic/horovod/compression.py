"""``hvd.Compression``: how a tensor travels in an allreduce (``none``, or ``fp16``).

A compressor has Horovod's two static methods, ``compress(tensor) -> (tensor, ctx)``
and ``decompress(tensor, ctx) -> tensor``. ``hvd.allreduce(t, compression=...)`` runs
any compressor around the collective. ``hvd.DistributedOptimizer`` knows the two below
by name and hands them to our gradient reducer, which compresses inside its fused
buckets (``compression="fp16"`` of ``elastic.torch``); a compressor of the user's own
cannot go there and is refused.
"""

from __future__ import annotations

from typing import Any

import torch

from elastic.horovod.errors import HorovodUnsupportedError


class Compressor:
    """The interface of a compressor (Horovod's): both methods are static."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor to send and what ``decompress`` needs to undo it."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The received ``tensor`` as the caller's tensor was (dtype, ...)."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 (half the bytes of float32) and come
    back in their own dtype; other tensors travel as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != torch.float16:
            return tensor.to(torch.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor.to(ctx) if ctx is not None and tensor.dtype != ctx else tensor


class Compression:
    """The compressors by Horovod's names: ``hvd.Compression.none``, ``hvd.Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor


def reducer_compression(compression: Any) -> str | None:
    """What our gradient reducer calls ``compression`` (None or "fp16").

    Raises:
        HorovodUnsupportedError: ``compression`` is not ``hvd.Compression.none`` or
            ``hvd.Compression.fp16`` (a compressor of the user's own).
    """
    if compression is None or compression is NoneCompressor:
        return None
    if compression is FP16Compressor:
        return "fp16"
    raise HorovodUnsupportedError(
        f"DistributedOptimizer(compression={getattr(compression, '__name__', compression)!r}) "
        "is not supported by elastic.horovod: gradients are compressed inside fused buckets, "
        "which know hvd.Compression.none and hvd.Compression.fp16 only"
    )


__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "reducer_compression"]
