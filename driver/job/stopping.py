"""A stop asked by SIGTERM or SIGINT, without losing the trained state.

With ``--checkpoint-dir`` the job first publishes a final round (``final_plan``: the
members still training, asked for a snapshot and to stop, ``Plan.snapshot``): each
member syncs, writes its part of the newest commit and exits. ``Stopping`` follows the
snapshots' records until the final one is complete (one in a folder every member sees,
or one on each member's host), or ``FINAL_SNAPSHOT_GRACE`` has passed; then the job
ends with ``JobStopped`` (``elastic-run`` exits 128 + the signal: a stopped job is no
failure, and the same command resumes it). Without a checkpoint directory, or on a
second signal, it ends at once.

``final_plan`` and ``Stopping`` are the rules (pure); ``StopControl`` carries them out
for the loop (``driver.job.loop``), given the job's state, its store session, the lead
(for the final round) and the message handlers (for the snapshots' records): while a stop waits, no rule
of the job runs (nothing starts), and only the snapshots' records, the workers' exits
and what ends a job reach it.
"""

from __future__ import annotations

import queue
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NoReturn

from driver import events as ev
from driver.errors import JobStopped
from driver.job import messages as msg
from driver.job.handlers import MessageHandlers
from driver.job.lead import JobLead
from driver.job.session import StoreSession
from driver.job.state import JobState
from driver.policy import planner
from driver.policy.lifecycle import Workers
from rendezvous.schema.rounds import SNAPSHOT_FINAL, Plan
from rendezvous.schema.snapshots import SnapshotRecord

FINAL_SNAPSHOT_GRACE = 30.0
"""Seconds a stop waits for its final snapshot before it ends without one (the
snapshots taken before it stand)."""

AFTER_LAST_EXIT = 2.0
"""Seconds a stop still waits for the final snapshot's record once every member of the
final round has exited (the record may reach the driver after the exits)."""


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def final_plan(plan: Plan | None, workers: Workers) -> Plan | None:
    """The final round after ``plan``: its members still training, in their order, asked
    to snapshot the newest commit and stop; None when none is left."""
    if plan is None:
        return None
    infos = []
    for member in plan.members:
        rec = workers.get(member.worker_id)
        if rec is not None and rec.state.active and rec.info is not None:
            infos.append(rec.info)
    if not infos:
        return None
    return replace(planner.build_plan(plan.round_id + 1, infos), snapshot=SNAPSHOT_FINAL)


@dataclass
class Stopping:
    """A stop under way: the signal, when it gives up waiting (monotonic), the final
    round and its members' hosts, and the final snapshots written so far, by host
    ("": a folder every member sees)."""

    signum: int
    deadline: float
    round_id: int
    hosts: frozenset[str]
    written: dict[str, SnapshotRecord] = field(default_factory=dict)
    all_exited_at: float | None = None

    def note(self, kind: str, record: SnapshotRecord | None) -> None:
        """A snapshot record came (``SnapshotReported``)."""
        if (
            kind == "done"
            and record is not None
            and record.final
            and record.round_id == self.round_id
        ):
            self.written[record.host] = record

    def members_gone(self, now: float) -> None:
        """Every member of the final round has exited."""
        if self.all_exited_at is None:
            self.all_exited_at = now

    def over(self, now: float) -> bool:
        """Whether the stop may end now."""
        return (
            "" in self.written
            or self.hosts <= set(self.written)
            or now >= self.deadline
            or (self.all_exited_at is not None and now >= self.all_exited_at + AFTER_LAST_EXIT)
        )

    def line(self, newest: tuple[int, str] | None) -> str:
        """The one line the stop ends with (``newest``: the newest snapshot known, as
        (step, path), for when the final one is not complete)."""
        name = signal_name(self.signum)
        final = self.written.get("") or (
            next(iter(self.written.values()))
            if self.hosts <= set(self.written) and self.written
            else None
        )
        if final is not None:
            where = final.path if not final.host else f"{final.path} (and each host's own copy)"
            return (
                f"stopped by {name}: the final snapshot of step {final.step} is in {where}; "
                "the same command resumes from it"
            )
        if newest is not None:
            return (
                f"stopped by {name}: no final snapshot in time; the newest one, of step "
                f"{newest[0]} in {newest[1]}, is what the same command resumes from"
            )
        return f"stopped by {name}: no snapshot of the state could be written; it is lost"


class StopControl:
    """A stop's steps, for the loop: ``signalled`` starts it (or ends the job now),
    ``turn`` waits for its final snapshot and ends the job when it may."""

    def __init__(
        self,
        state: JobState,
        session: StoreSession,
        lead: JobLead,
        handlers: MessageHandlers,
        events: ev.EventSink,
        clock: Callable[[], float],
    ):
        self._state = state
        self._session = session
        self._config = session.config
        self._events = events
        self._clock = clock
        self._lead = lead
        self._handlers = handlers
        self._stop: Stopping | None = None

    @property
    def active(self) -> bool:
        """A stop waits for its final snapshot."""
        return self._stop is not None

    def signalled(self, signum: int) -> None:
        """SIGTERM or SIGINT came: ask for a final snapshot when there is a round to
        write one and a directory to write it to (this driver still leading); else end.

        Raises:
            JobStopped: the job ends now (no snapshot to wait for, or a second signal).
        """
        name = signal_name(signum)
        if self._stop is not None:
            self.end(f"stopped by {name} again, before the final snapshot was complete", signum)
        final = final_plan(self._state.plan, self._state.workers) if self._session.leads else None
        if (
            self._config.checkpoint_dir
            and final is not None
            and self._lead.publish_snapshot_round(final)
        ):
            hosts = frozenset(m.host for m in final.members)
            deadline = self._clock() + FINAL_SNAPSHOT_GRACE
            self._stop = Stopping(signum, deadline, final.round_id, hosts)
            self._events.emit(ev.Stopping(name, final.round_id, final.size))
            return
        if self._config.restart_workers:
            kept = " (the script's own checkpoints are what the same command resumes from)"
        elif self._config.checkpoint_dir:
            kept = ""
        else:
            kept = " (no --checkpoint-dir: their state is not kept)"
        self.end(f"stopped by {name}; all workers were stopped{kept}", signum)

    def turn(
        self,
        inbox: queue.Queue[msg.Message],
        max_wait: float | None,
        handle: Callable[[msg.Message], object],
    ) -> None:
        """One turn while the stop waits: end the job once it may, else take the next
        message (``handle``: the loop's own, for what ends a job).

        Raises:
            JobStopped: the stop is over.
        """
        stop = self._stop
        assert stop is not None
        if stop.over(self._clock()):
            self.end(stop.line(self._newest()), stop.signum)
        wait = max(min(stop.deadline - self._clock(), 0.5), 0.01)
        try:
            message = inbox.get(timeout=wait if max_wait is None else min(wait, max_wait))
        except queue.Empty:
            return
        if isinstance(message, msg.SnapshotReported):
            stop.note(message.kind, message.record)
            self._handlers.on_snapshot(message)
        elif isinstance(message, msg.ProcessExited):
            self._handlers.note_exit(message)
            plan, workers = self._state.plan, self._state.workers
            members = plan.worker_ids if plan is not None else ()
            if not any(w in workers and workers[w].state.running for w in members):
                stop.members_gone(self._clock())
        elif isinstance(message, (msg.SignalReceived, msg.StoreLost, msg.Fatal, msg.LeadLost)):
            handle(message)

    def _newest(self) -> tuple[int, str] | None:
        """The newest complete snapshot this job knows of, as (step, where)."""
        known, directory = self._state.book.progress.snapshots, self._config.checkpoint_dir
        if not known or not directory:
            return None
        newest = max(known, key=lambda held: held.step)
        return newest.step, directory + (f" (on {newest.host})" if newest.host else "")

    def end(self, reason: str, signum: int) -> NoReturn:
        """Say how the stop ended (``job_stopped``), and end the job.

        Raises:
            JobStopped: always.
        """
        newest = self._newest()
        step, path = newest if newest is not None else (None, None)
        if self._stop is not None and self._stop.written:
            final = next(iter(self._stop.written.values()))
            step, path = final.step, final.path
        seconds = round(self._clock() - self._state.book.rounds.started_at, 3)
        self._events.emit(ev.JobStop(signal_name(signum), reason, step, path, seconds))
        raise JobStopped(reason, signum)
