"""How the driver's main loop (``driver.job.loop``) carries out what it decides and
handles what it hears: two tables of named handlers, one per kind of decision
(``driver.policy.decisions``) and one per kind of message (``driver.job.messages``).

Why tables: a journey through the loop can be read off them (and off the log: each
dispatch is logged at debug level, ``message ProcessExited: MessageHandlers.on_exit``),
and no part calls back into the loop: a handler returns the decisions it leads to, and
``Dispatch`` carries them out in turn, before the next decision of the rule that made
them.

The loop's own handlers that end the job (``fail``, ``fatal``, ``lead_lost``) are here
too: they need nothing of the loop but the decision or message they raise on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable, NoReturn

from driver.errors import JobFailed, LeadershipLost
from driver.job import messages as msg
from driver.job.state import JobState
from driver.policy import decisions as dec

log = logging.getLogger(__name__)

Handler = Callable[[Any], Sequence[dec.Decision]]
"""What carries out one decision, or handles one message: the decisions it leads to."""


class Dispatch:
    """The loop's two tables: ``decisions`` carries out each kind of decision, and
    ``messages`` handles each kind of message; ``state`` is the job as the loop knows it
    (its book keeps each rule's memory)."""

    def __init__(
        self,
        state: JobState,
        decisions: Mapping[type, Handler],
        messages: Mapping[type, Handler],
    ):
        self._state = state
        self._on_decision = decisions
        self._on_message = messages

    def apply(self, decisions: Iterable[dec.Decision]) -> None:
        """Carry ``decisions`` out in order; what carrying one out leads to (a launch
        that failed, a failure counted) is carried out before the next one."""
        pending = list(decisions)[::-1]
        while pending:
            decision = pending.pop()
            handler = self._on_decision[type(decision)]
            log.debug("decision %s: %s", type(decision).__name__, handler.__qualname__)
            pending.extend(reversed(handler(decision)))

    def step(self, step: dec.Step) -> None:
        """Carry out a rule's decisions and keep its book."""
        self.apply(self._state.take(step))

    def handle(self, message: msg.Message) -> bool:
        """Handle ``message`` and carry out what it leads to. Returns whether the rules
        must run again (something they read changed)."""
        state = self._state
        quiet = msg.changes_nothing(message, state.plan, state.book.progress.said_at is not None)
        accused = state.book.failures.accused
        handler = self._on_message[type(message)]
        log.debug("message %s: %s", type(message).__name__, handler.__qualname__)
        self.apply(handler(message))
        if msg.read_through_accusations(message):
            # Every survivor of a round of thousands reports its failure: a turn of the
            # rules for each would read every worker once per worker. The rules read a
            # report only through the accusations it makes or clears.
            quiet = state.book.failures.accused == accused
        return not quiet


def fail(decision: dec.Fail) -> NoReturn:
    """A rule gave the job up."""
    raise JobFailed(decision.reason)


def fatal(message: msg.Fatal) -> NoReturn:
    """A part of the job cannot go on (a ps shard, say)."""
    raise JobFailed(message.reason)


def lead_lost(message: msg.LeadLost) -> NoReturn:
    """Another driver took the job over."""
    raise LeadershipLost(message.reason)


def nothing(message: msg.Message) -> Sequence[dec.Decision]:
    """A message the rules' next turn reads for itself (an agent ready: its host is)."""
    return ()
