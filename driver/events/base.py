"""The base of the driver's event vocabulary: the ``Event`` class and its registry, the
``EventSink`` protocol, and the helpers the events' readable text shares.

Every event class (in ``driver.events.job``, ``.health``, ``.workers``, ``.hosts``,
``.ps``) derives from ``Event``; defining one registers its ``kind``, and refuses a
kind defined twice or a field the events file reserves. A module of its own so that
each area depends on it alone, never on another area.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from driver.errors import EventError

RESERVED_FIELDS = frozenset({"t", "elapsed", "kind"})
_VOCABULARY: dict[str, type[Event]] = {}


# ----------------------------------------------------------------------------- text helpers


def describe_code(code: Any) -> str:
    """``exit 3``, ``killed by SIGKILL`` (for -9), or the value as it is."""
    if isinstance(code, bool) or not isinstance(code, int):
        return f"code {code}"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def format_seconds(value: Any) -> str:
    """``0.42s`` below ten seconds, ``12s`` from ten on; a value that is no number as it is."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.2f}s" if value < 10 else f"{value:.0f}s"
    return str(value)


def plural(n: Any, word: str) -> str:
    """``1 worker``, ``2 workers``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def worker_label(host: str, slot: int, rank: int | None = None) -> str:
    """``worker [rank] host:slot``, or ``worker host:slot`` outside the round."""
    return f"worker [{rank}] {host}:{slot}" if rank is not None else f"worker {host}:{slot}"


# ----------------------------------------------------------------------------- the base


@dataclass(frozen=True)
class Event:
    """Base of every event. A subclass sets ``kind`` (registered in the vocabulary when
    the class is made), may set ``quiet``, and defines ``__str__``.

    Raises:
        EventError: (when a subclass is defined) a field named ``t``, ``elapsed`` or
            ``kind``, or a kind another class already has.
    """

    kind: ClassVar[str] = ""
    quiet: ClassVar[bool] = False  # stderr only with --verbose (always in the file)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The class's own annotations (or, without any, its base's: checked already).
        own = getattr(cls, "__annotations__", {})
        reserved = sorted(
            RESERVED_FIELDS.intersection(
                name for name, hint in own.items() if "ClassVar" not in str(hint)
            )
        )
        if reserved:
            raise EventError(f"reserved event field(s) {reserved} in {cls.__name__}")
        kind = cls.__dict__.get("kind")
        if kind:
            if _VOCABULARY.get(kind, cls) is not cls:
                raise EventError(f"event kind {kind!r} defined twice")
            _VOCABULARY[kind] = cls


def vocabulary() -> Mapping[str, type[Event]]:
    """Every event kind and its class."""
    return dict(_VOCABULARY)


def is_known(event: object) -> bool:
    """True if ``event`` is an instance of a class of the vocabulary."""
    return isinstance(event, Event) and _VOCABULARY.get(event.kind) is type(event)


class EventSink(Protocol):
    """Where components send their events (an ``EventLog``, or a list in a test)."""

    def emit(self, event: Event) -> object: ...
