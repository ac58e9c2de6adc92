"""The agent's one rule: what to do about its host's processes (pure).

``reconcile`` compares what the leader wants (the host's assignments) with what runs
(the agent's process table) and returns the actions that close the gap, with the
agent's view of the leadership updated:

* terms: the agent remembers the highest leader term it has seen (in the leader record
  or in an assignment). An assignment of an older term is refused: it starts, stops
  and kills nothing (said once per assignment), so a leader that was paused and wakes
  up after a takeover changes nothing here;
* a current assignment that wants ``run`` and was never started is started (once: an
  id that ran and exited is not started again, a replacement gets a new id); one that
  wants ``stop`` or ``kill`` gets its process stopped or killed (if it was never
  started, it is reported as ended without running);
* a running process with no assignment at all (the leader removed it) is stopped;
* the leader gone for ``driver_timeout`` seconds, or the job said to be over: shut
  down (stop everything, exit).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Union

from rendezvous.schema.agents import Assignment


class ProcState(enum.Enum):
    RUNNING = "running"
    STOPPING = "stopping"  # SIGTERM sent, SIGKILL after the grace
    KILLED = "killed"  # SIGKILL sent
    EXITED = "exited"

    @property
    def alive(self) -> bool:
        return self is not ProcState.EXITED


@dataclass(frozen=True)
class AgentView:
    """What the agent knows of the leadership. ``leader_gone_since``: the (monotonic)
    time the leader record was last seen vanish, None while there is one; ``refused``:
    the (id, term) of stale assignments already said; ``ended``: the leader said the
    job is over."""

    highest_term: int = 0
    leader_gone_since: float | None = None
    refused: frozenset[tuple[str, int]] = frozenset()
    ended: bool = False


@dataclass(frozen=True)
class Start:
    assignment: Assignment


@dataclass(frozen=True)
class Stop:
    id: str


@dataclass(frozen=True)
class Kill:
    id: str


@dataclass(frozen=True)
class NeverStarted:
    """The leader took back an assignment before it was started: report it ended."""

    assignment: Assignment


@dataclass(frozen=True)
class Refuse:
    """An assignment of an older term than the highest seen (said once)."""

    assignment: Assignment
    highest_term: int


@dataclass(frozen=True)
class Shutdown:
    reason: str


JOB_OVER = "the job is over"
"""The reason of the agent's end when its job ended (an ordinary end: said quietly)."""


Action = Union[Start, Stop, Kill, NeverStarted, Refuse, Shutdown]


def leader_seen(view: AgentView, term: int | None, now: float) -> AgentView:
    """The leader record now says ``term`` (None: there is no leader record)."""
    if term is None:
        since = view.leader_gone_since if view.leader_gone_since is not None else now
        return replace(view, leader_gone_since=since)
    return replace(view, highest_term=max(view.highest_term, term), leader_gone_since=None)


def reconcile(
    assignments: Mapping[str, Assignment],
    processes: Mapping[str, ProcState],
    view: AgentView,
    now: float,
    driver_timeout: float,
) -> tuple[list[Action], AgentView]:
    """The actions that bring ``processes`` to what ``assignments`` want (see the module
    docstring), and the updated view."""
    if view.ended:
        return [Shutdown(JOB_OVER)], view
    gone = view.leader_gone_since
    if gone is not None and now - gone >= driver_timeout:
        reason = f"no driver for {driver_timeout:g}s (--driver-timeout)"
        return [Shutdown(reason)], view
    highest = max([view.highest_term, *(a.term for a in assignments.values())])
    actions: list[Action] = []
    refused = set(view.refused)
    for pid, assignment in sorted(assignments.items()):
        if assignment.term < highest:
            if (pid, assignment.term) not in refused:
                refused.add((pid, assignment.term))
                actions.append(Refuse(assignment, highest))
            continue
        state = processes.get(pid)
        if state is None:
            if assignment.want == "run":
                actions.append(Start(assignment))
            else:
                actions.append(NeverStarted(assignment))
        elif assignment.want == "stop" and state is ProcState.RUNNING:
            actions.append(Stop(pid))
        elif assignment.want == "kill" and state in (ProcState.RUNNING, ProcState.STOPPING):
            actions.append(Kill(pid))
    for pid, state in sorted(processes.items()):
        if pid not in assignments and state is ProcState.RUNNING:
            actions.append(Stop(pid))
    return actions, replace(view, highest_term=highest, refused=frozenset(refused))
