"""The agent's process table: each process it started (or was told of), by id.

Owned by the agent's loop thread; the waiter threads only post exits to the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from driver.agent.rules import ProcState
from driver.launch.process import WorkerProcess
from rendezvous.schema.agents import Assignment


@dataclass(frozen=True)
class TableEntry:
    """One process: its assignment, its handle (None when it never ran), its state,
    and when it started and ended (unix times)."""

    assignment: Assignment
    process: WorkerProcess | None = field(compare=False)
    state: ProcState
    started: float
    code: int | None = None
    ended: float = 0.0


class ProcessTable:
    """The agent's processes by assignment id."""

    def __init__(self) -> None:
        self._entries: dict[str, TableEntry] = {}

    def add(self, entry: TableEntry) -> None:
        self._entries[entry.assignment.id] = entry

    def get(self, process_id: str) -> TableEntry | None:
        return self._entries.get(process_id)

    def set_state(self, process_id: str, state: ProcState) -> None:
        entry = self._entries[process_id]
        if entry.state is not ProcState.EXITED:
            self._entries[process_id] = replace(entry, state=state)

    def exited(self, process_id: str, code: int, now: float) -> TableEntry:
        """Its process ended with ``code`` at ``now``; the updated entry."""
        entry = replace(self._entries[process_id], state=ProcState.EXITED, code=code, ended=now)
        self._entries[process_id] = entry
        return entry

    def states(self) -> dict[str, ProcState]:
        return {pid: e.state for pid, e in self._entries.items()}

    def alive(self) -> list[TableEntry]:
        """Entries whose process has not exited (and has one)."""
        return [e for e in self._entries.values() if e.state.alive and e.process is not None]

    def processes(self) -> list[WorkerProcess]:
        return [e.process for e in self._entries.values() if e.process is not None]
