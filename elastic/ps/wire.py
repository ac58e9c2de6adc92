"""Tensors on the wire: one message = a JSON header + the raw bytes of each array.

Built on ``rendezvous.rpc.frame``/``unframe``: ``header["tensors"]`` lists each
array's metadata (caller's keys plus ``dtype``, ``shape``, ``nbytes``) in blob order.
Encoding hands the arrays' own memory to ``frame`` (one copy, into the message);
decoding returns read-only zero-copy views of the message (writable when the message
is a ``bytearray``).

A payload is handled as "pieces" (a header and the arrays' own memory), never joined
into one big message: ``cut`` takes the views covering any byte range of their
concatenation, so a chunk is sent from, or received into, the arrays themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from elastic.ps.errors import PSShapeError
from rendezvous.rpc import frame, unframe

TENSORS = "tensors"  # the header key of the tensors' metadata


def tensor_metas(header: dict) -> list[dict]:
    """The metadata of a message's tensors (caller's keys, dtype, shape, nbytes)."""
    return list(header.get(TENSORS, ()))


def check_dtype(dtype) -> np.dtype:
    """A dtype that can travel as raw bytes (numbers and booleans). Raises PSShapeError."""
    dt = np.dtype(dtype)
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
    for meta in tensor_metas(header):
        dt = check_dtype(meta["dtype"])
        shape = tuple(int(x) for x in meta["shape"])
        nbytes = int(meta["nbytes"])
        count = int(np.prod(shape, dtype=np.int64))
        if count * dt.itemsize != nbytes or offset + nbytes > len(body):
            raise PSShapeError(
                f"tensor {meta.get('name')!r}: header says {nbytes} bytes of "
                f"{dt} {shape} but the message does not hold them"
            )
        array = np.frombuffer(body, dtype=dt, count=count, offset=offset).reshape(shape)
        tensors.append((meta, array))
        offset += nbytes
    if offset != len(body):
        raise PSShapeError(f"message has {len(body) - offset} bytes beyond its tensors")
    return tensors


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
