"""What the round rules remember (``driver.policy.rounds``; restart mode's between
worlds, ``driver.policy.restarts``): the job's clock, its resets, the waits in progress,
and the slots and training that finished (``driver.policy.exits`` says so)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from driver.policy.planner import WorkerSlot


@dataclass(frozen=True)
class RoundBook:
    """The round rules' memory; replaced, never changed.

    ``started_at``: when the job started. ``resets``: rounds (worlds) re-formed so far.
    ``np_registered_at``: when ``-np`` workers first registered (the first round's
    grace counts from it). ``broken_since``: since when no round can form;
    ``waiting_reported``: that wait was said. ``member_finished_at``: when a member last
    exited 0 (the finish grace). ``change_at``: when the membership first changed since
    the last round (the next round's formation time counts from it). ``done_slots``:
    slots whose worker finished (they are not refilled). ``training_done_at``: when the
    driver learned that a worker's ``@elastic.run`` function returned having committed
    the final step (its finish record, ``JobKeys.training_finished``): that commit is
    the job's result, so no new round forms, no slot is refilled, the chaos kills
    nobody, and what dies after it is no failure of the job (``policy.exits``)."""

    started_at: float
    resets: int = 0
    np_registered_at: float | None = None
    broken_since: float | None = None
    waiting_reported: bool = False
    member_finished_at: float | None = None
    change_at: float | None = None
    done_slots: frozenset[WorkerSlot] = frozenset()
    training_done_at: float | None = None

    @property
    def training_done(self) -> bool:
        """The training is complete (see ``training_done_at``)."""
        return self.training_done_at is not None

    def training_finished(self, now: float) -> RoundBook:
        """The driver learned at ``now`` that the training is complete (kept from the
        first time it learned it)."""
        return self if self.training_done_at is not None else replace(self, training_done_at=now)

    def changed(self, now: float) -> RoundBook:
        """The membership changed at ``now``."""
        return self if self.change_at is not None else replace(self, change_at=now)

    def finished(self, host: str, slot: int, in_round: bool, now: float) -> RoundBook:
        """The worker in ``host:slot`` exited 0 on its own (a member, if ``in_round``)."""
        return replace(
            self,
            done_slots=self.done_slots | {WorkerSlot(host, slot)},
            member_finished_at=now if in_round else self.member_finished_at,
        )
