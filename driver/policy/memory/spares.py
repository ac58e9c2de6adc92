"""What the spare rules remember (``driver.policy.spares``): hosts where no spare is
started before a time (one of their spares was just promoted, or died before it
registered)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class SpareHold(NamedTuple):
    """No spare starts on ``host`` before ``until``."""

    host: str
    until: float


@dataclass(frozen=True)
class SpareBook:
    """The spare rules' memory; replaced, never changed."""

    holds: tuple[SpareHold, ...] = ()
