"""What the files of one checkpoint must hold, checked before anything is built from them.

A file can pass its checksum and still be malformed: written by a bug, or by someone who
could write the checkpoint directory. Restoring such a file must not crash the shard (it
would crash again at every restart) nor allocate what a number in it claims, so every
field is checked here first:

* each header is an object of this format, checkpoint, shard and shard count;
* each variable's slice is well formed and its optimizer can be rebuilt;
* each tensor belongs to a variable, a parameter has its slice's shape and dtype, a slot
  has that shape or none (a scalar), and every slice holds exactly its optimizer's slots;
* the slices of each variable, over all files, agree on its shape and dtype and cover
  its rows exactly once, so a variable is never larger than the bytes the files hold.

``check_checkpoint`` raises ``PSCheckpointError`` naming the file and what is wrong;
``load_newest`` then falls back to the previous complete checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from ps.errors import PSCheckpointError, PSError
from ps.optimizers import make_optimizer
from ps.partition import Slice
from ps.wire import check_dtype


class _Bad(Exception):
    """Internal: what is wrong with one file (the caller names the file)."""


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _slice(name: str, raw, index: int) -> Slice:
    try:
        sl = Slice.from_dict(raw)
        check_dtype(sl.dtype)
    except (KeyError, TypeError, ValueError, AttributeError, PSError) as exc:
        raise _Bad(f"variable {name!r}: bad slice {str(raw)[:80]}: {exc}") from None
    if sl.name != name or sl.shard != index:
        raise _Bad(f"variable {name!r}: slice of {sl.name!r} on shard {sl.shard}")
    if any(d < 0 for d in sl.full_shape) or not 0 <= sl.start <= sl.stop <= sl.rows:
        raise _Bad(f"variable {name!r}: rows {sl.start}:{sl.stop} of shape {sl.full_shape}")
    return sl


def _slot_names(name: str, optimizer) -> set[str]:
    if not isinstance(optimizer, dict):
        raise _Bad(f"variable {name!r}: optimizer {str(optimizer)[:80]} is not an object")
    try:
        return set(make_optimizer(**optimizer).slots(np.zeros(0)))
    except (TypeError, ValueError, PSError) as exc:
        raise _Bad(f"variable {name!r}: optimizer {str(optimizer)[:80]}: {exc}") from None


def _check_file(header, tensors: list, checkpoint_id: int, index: int, num_shards: int):
    """The slices one file holds, by variable. Raises _Bad."""
    if not isinstance(header, dict):
        raise _Bad("the header is not an object")
    expected = {"checkpoint_id": checkpoint_id, "shard": index, "num_shards": num_shards}
    for key, value in expected.items():
        if header.get(key) != value or not _integer(header.get(key)):
            raise _Bad(f"{key} is {str(header.get(key))[:40]}, the manifest says {value}")
    if not _integer(header.get("step")) or header["step"] < 0:
        raise _Bad(f"step {str(header.get('step'))[:40]} is not a step")
    dedup = header.get("dedup", {})
    if not isinstance(dedup, dict) or not all(_integer(v) for v in dedup.values()):
        raise _Bad("dedup is not a table of push numbers")
    variables = header.get("variables")
    if not isinstance(variables, dict):
        raise _Bad("no variables table")
    slices, slots = {}, {}
    for name, info in variables.items():
        if not isinstance(info, dict):
            raise _Bad(f"variable {name!r}: not an object")
        slices[name] = _slice(name, info.get("slice"), index)
        slots[name] = _slot_names(name, info.get("optimizer"))
    params: set[str] = set()
    found: dict[str, set[str]] = {name: set() for name in variables}
    for meta, array in tensors:
        var, slot = meta.get("var"), meta.get("slot")
        if var not in slices or not (slot is None or isinstance(slot, str)):
            raise _Bad(f"tensor of {str(var)[:40]!r} (slot {str(slot)[:40]!r}) has no variable")
        sl = slices[var]
        if slot is None:
            if var in params or array.shape != sl.shape or array.dtype != np.dtype(sl.dtype):
                raise _Bad(f"variable {var!r}: parameter {array.dtype} {array.shape}")
            params.add(var)
        elif slot in found[var] or array.shape not in (sl.shape, ()):
            raise _Bad(f"variable {var!r}: slot {slot!r} of shape {array.shape}")
        else:
            found[var].add(slot)
    for name in variables:
        if name not in params or found[name] != slots[name]:
            raise _Bad(
                f"variable {name!r}: holds {'a' if name in params else 'no'} parameter and "
                f"slots {sorted(found[name])}, its optimizer has {sorted(slots[name])}"
            )
    return slices


def _check_cover(name: str, slices: list[tuple[Slice, str]]) -> None:
    """The slices of one variable tile its rows exactly. Raises PSCheckpointError."""
    first, where = slices[0]
    for sl, path in slices:
        if (sl.full_shape, sl.dtype) != (first.full_shape, first.dtype):
            raise PSCheckpointError(
                f"{path}: malformed contents: variable {name!r} is {sl.dtype} {sl.full_shape} here and "
                f"{first.dtype} {first.full_shape} in {where}"
            )
    row = 0
    for sl, path in sorted(slices, key=lambda s: (s[0].start, s[0].stop)):
        if sl.start != row:
            raise PSCheckpointError(
                f"{path}: malformed contents: variable {name!r} rows {sl.start}:{sl.stop} do not follow row {row}"
            )
        row = sl.stop
    if row != first.rows:
        raise PSCheckpointError(
            f"{where}: malformed contents: variable {name!r} has rows up to {row} of {first.rows} in the checkpoint"
        )


def check_checkpoint(
    directory: str,
    checkpoint_id: int,
    num_shards: int,
    files: Mapping[int, tuple[str, tuple[dict, list]]],
) -> None:
    """Check the parsed files (by shard index: file name, (header, tensors)) of one
    checkpoint of ``num_shards`` shards.

    Raises:
        PSCheckpointError: the first problem found, naming its file."""
    by_var: dict[str, list[tuple[Slice, str]]] = {}
    for index, (name, (header, tensors)) in sorted(files.items()):
        path = os.path.join(directory, name)
        try:
            slices = _check_file(header, tensors, checkpoint_id, index, num_shards)
        except _Bad as exc:
            raise PSCheckpointError(f"{path}: malformed contents: {exc}") from None
        for var, sl in slices.items():
            by_var.setdefault(var, []).append((sl, path))
    for var, slices_of_var in by_var.items():
        _check_cover(var, slices_of_var)
