"""A state's committed values as bytes: a small pickled skeleton, and its large arrays
as raw bytes apart (``Leaf``), so that the arrays can be cut into parts and written by
several workers at once, and read back without a copy through pickle.

The skeleton is the committed values pickled with every large array replaced by a
reference (pickle's persistent ids); arrays below ``MIN_LEAF_BYTES`` stay inside it.
Which objects are arrays is a registry of leaf codecs: numpy's here, torch's from
``elastic.torch`` (this module imports neither torch nor anything that does).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from elastic.errors import SnapshotError

MIN_LEAF_BYTES = 64 * 1024
"""Arrays smaller than this are pickled inside the skeleton (a leaf of its own costs a
manifest entry and a piece of a part)."""


class LeafBytes(Protocol):
    """An array's raw bytes, read a range at a time: each writer reads only its own
    pieces (an array in a GPU's memory is copied to the host a piece at a time, by the
    writer that writes that piece, never whole by every writer)."""

    @property
    def nbytes(self) -> int: ...

    def read(self, start: int, stop: int) -> memoryview:
        """Bytes ``start`` to ``stop`` (raises what the array's device raises)."""
        ...


@dataclass(frozen=True)
class HostBytes:
    """Raw bytes already in this process's memory: ranges are views, no copy."""

    view: memoryview

    @property
    def nbytes(self) -> int:
        return self.view.nbytes

    def read(self, start: int, stop: int) -> memoryview:
        return self.view[start:stop]


Encode = Callable[[Any], "tuple[dict, LeafBytes] | None"]
Decode = Callable[[dict, bytearray], Any]


@dataclass(frozen=True)
class Leaf:
    """One large array of a state: its codec's ``kind``, what the codec needs to build it
    again (``meta``: dtype, shape, ...), and its raw bytes (``data``)."""

    kind: str
    meta: dict
    data: LeafBytes

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


_CODECS: dict[str, tuple[type, Encode, Decode]] = {}


def register_leaf_codec(kind: str, cls: type, encode: Encode, decode: Decode) -> None:
    """Make objects of ``cls`` leaves of kind ``kind``: ``encode(obj)`` gives their meta
    and raw bytes (``LeafBytes``, read later by the writers; None: pickle it in the
    skeleton), ``decode(meta, buffer)`` builds one from them (``buffer`` is the
    object's own: it may keep it)."""
    _CODECS[kind] = (cls, encode, decode)


def leaf_kind(obj: Any) -> str | None:
    """The kind of leaf codec that writes ``obj`` (its class registered), or None."""
    for kind, (cls, _, _) in _CODECS.items():
        if isinstance(obj, cls):
            return kind
    return None


def _encode_ndarray(array: np.ndarray) -> tuple[dict, LeafBytes] | None:
    if array.dtype.hasobject:
        return None  # objects, not bytes: pickled
    contiguous = np.ascontiguousarray(array)
    meta = {"dtype": contiguous.dtype.str, "shape": list(contiguous.shape)}
    return meta, HostBytes(memoryview(contiguous.reshape(-1).view(np.uint8).data))


def _decode_ndarray(meta: dict, buffer: bytearray) -> np.ndarray:
    dtype = np.dtype(meta["dtype"])
    return np.frombuffer(buffer, dtype=dtype).reshape(meta["shape"])


register_leaf_codec("ndarray", np.ndarray, _encode_ndarray, _decode_ndarray)


def split(values: Any) -> tuple[bytes, list[Leaf]]:
    """The skeleton of ``values`` (pickled) and its large arrays, in the order the
    skeleton refers to them.

    Raises:
        SnapshotError: ``values`` cannot be pickled (the message names why).
    """
    leaves: list[Leaf] = []

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            for kind, (cls, encode, _) in _CODECS.items():
                if isinstance(obj, cls):
                    encoded = encode(obj)
                    if encoded is None or encoded[1].nbytes < MIN_LEAF_BYTES:
                        return None
                    leaves.append(Leaf(kind, encoded[0], encoded[1]))
                    return len(leaves) - 1
            return None

    buffer = io.BytesIO()
    try:
        Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(values)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise SnapshotError(f"the committed state cannot be written: {exc}") from None
    return buffer.getvalue(), leaves


def join(
    skeleton: bytes, kinds: Sequence[str], metas: Sequence[dict], buffers: Sequence[bytearray]
) -> Any:
    """The values ``split`` took apart: the skeleton with leaf ``i`` built from
    ``kinds[i]``, ``metas[i]`` and its raw bytes ``buffers[i]``.

    Raises:
        SnapshotError: a leaf's codec is not registered (e.g. torch tensors without
            ``import elastic.torch``), or the skeleton does not unpickle.
    """

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            index = int(pid)
            codec = _CODECS.get(kinds[index])
            if codec is None:
                raise SnapshotError(
                    f"the snapshot holds {kinds[index]!r} arrays, which this process cannot "
                    "build (import the module that writes them, e.g. elastic.torch)"
                )
            return codec[2](metas[index], buffers[index])

    try:
        return Unpickler(io.BytesIO(skeleton)).load()
    except SnapshotError:
        raise
    except Exception as exc:  # noqa: BLE001  (unpickling runs the snapshot's own code paths)
        raise SnapshotError(f"the snapshot's skeleton does not load: {exc!r}") from None
