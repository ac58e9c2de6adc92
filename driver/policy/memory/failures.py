"""What the failure rules remember: the failures counted (``driver.policy.exits``, the
round rules' ``script_fails`` and ``rounds_lost``) and who is suspected of being dead
(``driver.policy.suspicion``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple


class Accusation(NamedTuple):
    """``worker_id`` stands accused by a peer's failure report since ``since``, for
    ``why`` (a kill waits for its own silence: ``policy.suspicion``)."""

    worker_id: str
    since: float
    why: str


@dataclass(frozen=True)
class FailureBook:
    """The failure rules' memory; replaced, never changed.

    ``streak``: workers failed in a row with no round forming. ``all_failed_rounds``:
    rounds whose members all failed with an error code of their own; ``lost_rounds``:
    rounds whose members all died on their own, whatever the code or signal. Of the
    current round: ``reporters``, the workers that reported a failure, and ``accused``,
    those blamed by them; ``probing``: hosts whose reachability is being asked.
    ``ring_round``: the newest round published that was no handover: the members of a
    handover train on the ring of the round before it until their next commit, so its
    reports (from ``ring_round`` on) are the current round's (``policy.suspicion``)."""

    streak: int = 0
    all_failed_rounds: frozenset[int] = frozenset()
    lost_rounds: frozenset[int] = frozenset()
    reporters: frozenset[str] = frozenset()
    accused: tuple[Accusation, ...] = ()
    probing: frozenset[str] = frozenset()
    ring_round: int = 0

    def new_round(self, round_id: int = 0, handover: bool = False) -> FailureBook:
        """Round ``round_id`` was published: the reports of the one before are settled,
        unless it is a ``handover`` (its members still train on the ring those reports
        are of: a member blamed there stays blamed)."""
        if handover:
            return self
        return replace(self, reporters=frozenset(), accused=(), ring_round=round_id)
