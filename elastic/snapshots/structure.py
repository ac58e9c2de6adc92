"""The structure of a state's committed values, which a snapshot is tagged with, and
what differs between a snapshot's and a state's (pure).

A structure is the state's attributes (the top-level names of its committed values)
and every array found in its containers (dicts, lists, tuples): its path from the
attribute (``model[1]['fc.weight']``), its codec's kind (``ndarray``, ``torch``), dtype
and shape. Other values are not described: they change as a state trains (a counter,
a history that grows, an optimizer whose moments appear at its first step).

A snapshot fits a state (``differences`` is empty) when it holds no attribute the
state lacks (it would bring another training's values in; the library's own, such as
a sampler's progress, appear at the first step and are not counted) and every array
at a path both hold has one kind, dtype and shape. An array only one of them holds is
no difference: an optimizer's moments exist only after its first step, and an
attribute the snapshot does not hold keeps the value the script gave it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from elastic.snapshots.codec import leaf_kind

LIBRARY_PREFIX = "_elastic_"
"""The attributes the library adds to a state as it trains (``elastic.sampler``'s
progress): a state not yet trained lacks them, so they are never a difference."""

MAX_NODES = 200_000
"""Containers and items walked at most: describing a state's structure costs well under
a second, even one holding a list of millions of numbers (whose items are not arrays)."""


@dataclass(frozen=True)
class ArrayShape:
    """One array of a state: where it is, its codec's kind, dtype and shape."""

    path: str
    kind: str
    dtype: str
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.kind} {self.dtype} {list(self.shape)}"


@dataclass(frozen=True)
class Structure:
    """A state's attributes (``names``, sorted) and its arrays (``arrays``, by path)."""

    names: tuple[str, ...]
    arrays: tuple[ArrayShape, ...]

    @property
    def digest(self) -> str:
        """A short SHA-256 of the whole structure (two equal structures, one digest)."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        return {
            "names": list(self.names),
            "arrays": [[a.path, a.kind, a.dtype, list(a.shape)] for a in self.arrays],
        }

    @classmethod
    def from_json(cls, raw: Any) -> Structure:
        """Raises ``ValueError`` on anything a writer does not write."""
        if not isinstance(raw, dict):
            raise ValueError("its structure is not an object")
        names, arrays = raw.get("names"), raw.get("arrays")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("its structure's names are not a list of strings")
        if not isinstance(arrays, list):
            raise ValueError("its structure's arrays are not a list")
        shapes = []
        for entry in arrays:
            if (
                not isinstance(entry, list)
                or len(entry) != 4
                or not all(isinstance(x, str) for x in entry[:3])
                or not isinstance(entry[3], list)
                or not all(isinstance(d, int) and not isinstance(d, bool) for d in entry[3])
                or any(d < 0 for d in entry[3])
            ):
                raise ValueError(
                    f"its structure holds an array entry no writer writes: {entry!r:.80}"
                )
            shapes.append(ArrayShape(entry[0], entry[1], entry[2], tuple(entry[3])))
        return cls(tuple(names), tuple(shapes))


def describe(values: Any) -> Structure:
    """The structure of a state's committed values (its ``_snapshot_payload``: a dict of
    attribute names; anything else is one unnamed value)."""
    arrays: list[ArrayShape] = []
    budget = [MAX_NODES]

    def walk(value: Any, path: str) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            return
        kind = leaf_kind(value)
        if kind is not None:
            shape = tuple(int(d) for d in value.shape)
            arrays.append(ArrayShape(path, kind, str(value.dtype), shape))
        elif isinstance(value, dict):
            for key in sorted(value, key=repr):
                walk(value[key], f"{path}[{key!r}]")
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]")

    if isinstance(values, dict):
        names = tuple(sorted(str(name) for name in values))
        for name in sorted(values, key=str):
            walk(values[name], str(name))
    else:
        names = ()
        walk(values, "")
    return Structure(names, tuple(arrays))


def differences(snapshot: Structure, state: Structure) -> list[str]:
    """What keeps values of structure ``snapshot`` from loading into a state of
    structure ``state`` (see the module docstring), each difference one phrase; []
    when they fit."""
    names = set(state.names)
    found = [
        f"it holds {name!r}, which this state does not"
        for name in snapshot.names
        if name not in names and not name.startswith(LIBRARY_PREFIX)
    ]
    here = {a.path: a for a in state.arrays}
    for array in snapshot.arrays:
        mine = here.get(array.path)
        if mine is not None and (mine.kind, mine.dtype, mine.shape) != (
            array.kind,
            array.dtype,
            array.shape,
        ):
            found.append(f"{array.path} is {array} in it, {mine} in this state")
    return found


def summary(found: Sequence[str], shown: int = 2) -> str:
    """The first ``shown`` differences in one line, and how many more there are."""
    more = len(found) - shown
    return "; ".join(found[:shown]) + (f" (and {more} more)" if more > 0 else "")
