"""Tensors on the wire: one message = a JSON header + the raw bytes of each array.

Built on ``rendezvous.net.rpc_wire.frame``/``unframe``: ``header["tensors"]`` lists each
array's metadata (caller's keys plus ``dtype``, ``shape``, ``nbytes``) in blob order.
Encoding hands the arrays' own memory to ``frame`` (one copy, into the message);
decoding returns read-only zero-copy views of the message (writable when the message
is a ``bytearray``).

A payload is handled as "pieces" (a header and the arrays' own memory), never joined
into one big message: ``cut`` takes the views covering any byte range of their
concatenation, so a chunk is sent from, or received into, the arrays themselves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ps.errors import PSShapeError
from rendezvous.net.rpc_wire import frame, unframe

TENSORS = "tensors"  # the header key of the tensors' metadata


def tensor_metas(header: dict) -> list[dict]:
    """The metadata of a message's tensors (caller's keys, dtype, shape, nbytes)."""
    return list(header.get(TENSORS, ()))


def check_dtype(dtype) -> np.dtype:
    """A dtype that can travel as raw bytes (numbers and booleans). Raises PSShapeError."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise PSShapeError(f"{str(dtype)[:40]!r} is not a dtype") from None
    if dt.kind not in "biufc" or dt.hasobject:
        raise PSShapeError(f"dtype {dt} cannot be sent: only numeric and bool arrays can")
    return dt


def _raw(array: np.ndarray) -> memoryview:
    array = np.require(array, requirements="C")
    return array.reshape(-1).view(np.uint8).data


def layout(tensors: list[tuple[dict, np.ndarray]]) -> tuple[list[dict], list[memoryview]]:
    """The header entries (caller's metadata plus dtype, shape, nbytes) and the raw
    bytes of each array, uncopied. Raises PSShapeError for a dtype that cannot travel."""
    metas, blobs = [], []
    for meta, array in tensors:
        array = np.asarray(array)
        dt = check_dtype(array.dtype)
        metas.append({**meta, "dtype": dt.str, "shape": list(array.shape), "nbytes": array.nbytes})
        blobs.append(_raw(array))
    return metas, blobs


def encode_parts(header: dict, tensors: list[tuple[dict, np.ndarray]]) -> list:
    """The pieces of ``encode``'s message, uncopied: joined they are the message (for
    senders and writers that stream). Raises PSShapeError for a bad dtype."""
    metas, blobs = layout(tensors)
    return [frame({**header, TENSORS: metas}), *blobs]


def encode(header: dict, tensors: list[tuple[dict, np.ndarray]]) -> bytes:
    """``header`` plus ``tensors`` (metadata dict, array) in one message.
    Raises PSShapeError for a dtype that cannot travel."""
    return b"".join(encode_parts(header, tensors))


def decode(message: bytes | bytearray | memoryview) -> tuple[dict, list[tuple[dict, np.ndarray]]]:
    """Inverse of ``encode``. Raises PSShapeError when the blobs do not match the header."""
    header, body = unframe(message)  # type: ignore[arg-type]  # any bytes-like object
    return header, tensors_of(header, body)


def tensors_of(header: dict, body) -> list[tuple[dict, np.ndarray]]:
    """The arrays of a message body (the blobs after the frame header), zero-copy.
    Raises PSShapeError when the blobs do not match ``header["tensors"]``."""
    body = memoryview(body).cast("B")
    tensors, offset = [], 0
    metas = header.get(TENSORS, ())
    if not isinstance(metas, list):
        raise PSShapeError(f"{TENSORS!r} of a message is not a list")
    for meta in metas:
        dt, shape, nbytes = _layout_of(meta)
        if offset + nbytes > len(body):
            raise PSShapeError(
                f"tensor {meta.get('name')!r}: header says {nbytes} bytes of "
                f"{dt} {shape} but the message does not hold them"
            )
        count = nbytes // dt.itemsize
        array = np.frombuffer(body, dtype=dt, count=count, offset=offset).reshape(shape)
        tensors.append((meta, array))
        offset += nbytes
    if offset != len(body):
        raise PSShapeError(f"message has {len(body) - offset} bytes beyond its tensors")
    return tensors


def tensor_bytes(meta) -> int:
    """The byte count one tensor's metadata states, checked against its dtype and shape
    (what a reader allocates for it). Raises PSShapeError naming what is wrong."""
    return _layout_of(meta)[2]


def _layout_of(meta) -> tuple[np.dtype, tuple[int, ...], int]:
    """The dtype, shape and byte count one tensor's metadata states, checked against each
    other (Python integers: no overflow). Raises PSShapeError naming what is wrong."""
    if not isinstance(meta, dict):
        raise PSShapeError(f"tensor metadata is not an object: {str(meta)[:40]}")
    dt = check_dtype(meta.get("dtype"))
    shape, nbytes = meta.get("shape"), meta.get("nbytes")
    if (
        not isinstance(shape, list)
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape)
        or not isinstance(nbytes, int)
        or math.prod(shape) * dt.itemsize != nbytes
    ):
        raise PSShapeError(
            f"tensor {str(meta.get('name'))[:40]!r}: shape {str(shape)[:40]} of {dt} "
            f"does not make {str(nbytes)[:20]} bytes"
        )
    return dt, tuple(shape), nbytes


def as_pieces(payload) -> list[memoryview]:
    """A payload (bytes-like, or a list of them) as flat byte views."""
    if isinstance(payload, (list, tuple)):
        return [memoryview(p).cast("B") for p in payload]
    return [memoryview(payload).cast("B")]


def size_of(pieces: Sequence[memoryview]) -> int:
    return sum(p.nbytes for p in pieces)


def cut(pieces: Sequence[memoryview], offset: int, length: int) -> list[memoryview]:
    """The views covering bytes ``[offset, offset + length)`` of the pieces' concatenation."""
    out, pos, end = [], 0, offset + length
    for p in pieces:
        lo, hi = max(offset, pos), min(end, pos + p.nbytes)
        if lo < hi:
            out.append(p[lo - pos : hi - pos])
        pos += p.nbytes
        if pos >= end:
            break
    return out
