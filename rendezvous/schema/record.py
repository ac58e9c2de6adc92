"""The encoding every record of the store shares: ``JsonRecord`` gives a frozen
dataclass ``to_json`` and a ``from_json`` that takes a newer writer's record in its
stride (fields it does not know are ignored)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TypeVar

R = TypeVar("R", bound="JsonRecord")


class JsonRecord:
    """``to_json``/``from_json`` for a record dataclass whose readers take fields they do
    not know from a newer writer in their stride (unknown fields are ignored)."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()  # type: ignore[call-overload]

    @classmethod
    def from_json(cls: type[R], data: bytes) -> R:
        raw = json.loads(data)
        known = {f: raw[f] for f in cls.__dataclass_fields__ if f in raw}  # type: ignore[attr-defined]
        return cls(**known)
