"""What the workers' side tells the driver's main loop, turned into the job's state and
the rules' decisions: a process exit, a registration (or its end), a failure or
silence report, a probe's answer, a lost agent, rank 0's progress, a chaos tick.

``MessageHandlers`` is given what it uses: the job's state, its store session (the keys,
the store's trouble, a registration read again later: ``driver.job.session``), the
store's quiet reads and fenced deletes (``driver.job.fenced``), the held workers, the
chaos, the event sink, the clock.
The main loop (``driver.job.loop``) dispatches these messages to it; each handler returns
the rules' decisions, which the loop carries out (no handler calls back into the loop).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Callable

from driver import events as ev
from driver.job import messages as msg
from driver.job.chaos import ChaosMonkey
from driver.job.processes import ask_stacks
from driver.job.worker_parts import WorkerParts
from driver.policy import decisions as dec
from driver.policy import (
    exits,
    hangs,
    lifecycle,
    occupancy,
    preemption,
    reports,
    restarts,
    suspicion,
)
from driver.policy.reports import ProgressSettings
from rendezvous.schema.agents import RETURN_GRACE
from rendezvous.schema.workers import FailureRecord, FinishRecord, ProgressRecord, WorkerInfo
from rendezvous.store import PUT, KeyValue

log = logging.getLogger(__name__)

Decisions = Sequence[dec.Decision]


class MessageHandlers:
    """One handler per message about the workers; each returns the decisions it leads
    to, for the loop to carry out."""

    def __init__(
        self,
        parts: WorkerParts,
        chaos: ChaosMonkey | None,
        events: ev.EventSink,
        clock: Callable[[], float],
    ):
        self._state, self._session = parts.state, parts.session
        self._fenced, self._held = parts.fenced, parts.held
        self._chaos = chaos
        self._events = events
        self._clock = clock
        self._config = parts.session.config
        # Registrations whose lease lapsed while the store was in trouble, not yet
        # written again: read again after ``RETURN_GRACE`` (``on_registration_read``).
        self._lapsed: set[str] = set()

    def on_exit(self, message: msg.ProcessExited) -> Decisions:
        state, keys, fenced = self._state, self._session.keys, self._fenced
        rec = state.workers.get(message.worker_id)
        if rec is None or not rec.state.running:
            return ()  # an adopted worker's end, seen twice (its pid, a kill that gave it up)
        if rec.info is not None:
            # Do not wait for its lease: the process is gone.
            fenced.delete_quietly(keys.worker(rec.worker_id))
        # Its @elastic.run function returned having committed the final step: the
        # training is done, whatever its exit (the watch may not have said so yet).
        finish = fenced.value(keys.finished(rec.worker_id))
        returned = finish is not None
        if finish is not None:
            self.on_training_finished(finish)
        state.workers[rec.worker_id], (decisions, state.book) = exits.worker_exited(
            rec,
            message.code,
            state.plan,
            state.book,
            self._clock(),
            command=self._config.command,
            any_registered=state.any_registered(),
            trained_to_end=returned and message.code == 0,
        )
        return decisions

    def note_exit(self, message: msg.ProcessExited) -> None:
        """A worker's exit while the job stops: its record follows, no rule runs."""
        state = self._state
        rec = state.workers.get(message.worker_id)
        if rec is not None and rec.state.running:
            state.workers[rec.worker_id] = lifecycle.exited(rec, message.code, self._clock())

    def on_registry(self, message: msg.RegistryChanged) -> Decisions:
        """A registration written or gone. Gone while the store was in trouble, it may be
        the store's doing (``driver.policy.lapses``): its agent writes it again, so it
        counts only if it is still gone after ``RETURN_GRACE``."""
        event = message.event
        worker_id = event.key[len(self._session.keys.workers) :]
        if event.type == PUT:
            self._lapsed.discard(worker_id)
        elif self._session.store_trouble.explains_lapse():
            self._lapsed.add(worker_id)
            self._session.read_registration_later(worker_id, RETURN_GRACE)
            return ()
        self._set_registration(worker_id, event.kv if event.type == PUT else None)
        return ()

    def on_registration_read(self, message: msg.RegistrationRead) -> Decisions:
        """A lapsed registration read again (``on_registry``): still gone, it counts now,
        unless the store is still in trouble (read again later)."""
        worker_id = message.worker_id
        if worker_id not in self._lapsed:
            return ()  # written again meanwhile: its event came first
        if message.kv is None and (
            not message.readable or self._session.store_trouble.explains_lapse()
        ):
            self._session.read_registration_later(worker_id, RETURN_GRACE)
            return ()
        self._lapsed.discard(worker_id)
        self._set_registration(worker_id, message.kv)
        return ()

    def on_registry_resync(self, message: msg.RegistryResync) -> Decisions:
        """The registrations as read afresh after the registry watch was lost."""
        prefix = self._session.keys.workers
        registered = {kv.key[len(prefix) :]: kv for kv in message.kvs}
        for rec in list(self._state.workers.values()):
            if rec.state.running and (rec.worker_id in registered or rec.info is not None):
                self._set_registration(rec.worker_id, registered.get(rec.worker_id))
        return ()

    def _set_registration(self, worker_id: str, kv: KeyValue | None) -> None:
        """Worker ``worker_id`` is registered as ``kv``, or no longer (None)."""
        state = self._state
        rec = state.workers.get(worker_id)
        if rec is None or not rec.state.running:
            return
        now = self._clock()
        if kv is None and self._held.adopted.lapsed(worker_id):
            return  # an adopted worker on another host: its lapse is its end (posted)
        if kv is None:
            state.workers[worker_id] = lifecycle.unregistered(rec, now)
        else:
            info = WorkerInfo.from_json(kv.value)
            state.workers[worker_id] = lifecycle.registered(rec, info, kv.create_revision, now)
        if not rec.spare:
            state.book = state.book.changed(now)
        elif kv is not None and not rec.ever_registered:  # no membership changed
            took = round(now - rec.launched_at, 3)
            self._events.emit(ev.SpareReady(worker=worker_id, host=rec.host, took=took))

    def on_failure_report(self, message: msg.FailureReport) -> Decisions:
        report, state = message.record, self._state
        if report is None:
            return ()  # deleted (a new round settles the old reports) or unreadable
        if report.hung:
            return self._hang_reported(report)
        if report.silent:
            return state.take(
                suspicion.silence_reported(state.workers, state.plan, state.book, report)
            )
        return state.take(
            suspicion.failure_reported(state.workers, state.plan, state.book, report, self._clock())
        )

    def _hang_reported(self, report: FailureRecord) -> Decisions:
        """A worker's own hang report (``policy.hangs``): its ``hung`` line, then every
        thread's stack in the driver's log, and its kill."""
        decisions = hangs.hang_reported(self._state.workers, self._state.plan, report)
        kept: list[dec.Decision] = []
        for decision in decisions:
            if isinstance(decision, dec.Report) and isinstance(decision.event, ev.WorkerHung):
                self._events.emit(decision.event)  # (now: its stacks follow its line)
                stacks = decision.event.stacks.rstrip("\n") or "(none were sent)"
                log.warning("the stacks of hung worker %s:\n%s", report.worker_id, stacks)
            else:
                kept.append(decision)
        return kept

    def on_stacks_asked(self, message: msg.StacksAsked) -> Decisions:
        """SIGUSR1: every running worker that registered (and so prints its stacks on
        SIGUSR1: ``elastic.hangs.watchdog``) and runs on this machine is sent SIGUSR1;
        its stacks reach this driver's stderr with its output, prefixed with its rank.
        Nothing else changes: no round, no kill."""
        asked, elsewhere = [], []
        for rec in sorted(self._state.workers.values(), key=lambda r: r.worker_id):
            if not rec.state.running or rec.info is None:
                continue
            if ask_stacks(rec.worker_id, rec.info.pid):
                asked.append(f"{rec.worker_id} (pid {rec.info.pid})")
            else:
                elsewhere.append(f"{rec.worker_id} on {rec.host} (pid {rec.info.pid})")
        text = f"SIGUSR1: every thread's stack of {len(asked)} worker(s) follows on stderr"
        text += f", each line prefixed with its rank: {', '.join(asked)}" if asked else ""
        if elsewhere:
            text += (
                f"; not on this machine (send SIGUSR1 to the pid on its host): "
                f"{', '.join(elsewhere)}"
            )
        log.warning("%s", text)
        return ()

    def on_failure_resync(self, message: msg.FailureResync) -> Decisions:
        """The reports as they are now: those of the current round count as if just
        made (a silent peer reported while the job had no leader is probed now, not
        after its host's agent lease lapses); the rules ignore the older ones."""
        decisions: list[dec.Decision] = []
        for kv in message.kvs:
            decisions += self.on_failure_report(msg.FailureReport.from_kv(kv))
        return decisions

    def on_probe_answered(self, message: msg.ProbeAnswered) -> Decisions:
        state = self._state
        return state.take(
            suspicion.probe_answered(
                state.workers, state.book, message.host, message.reachable, message.detail
            )
        )

    def on_agent_lost(self, message: msg.AgentLost) -> Decisions:
        """A host whose agent stopped answering is lost, as a host that does not answer
        a probe: its workers are dropped at once and the host blacklisted."""
        return self.on_probe_answered(msg.ProbeAnswered(message.host, False, message.detail))

    def on_progress(self, message: msg.ProgressReported) -> Decisions:
        try:
            record = ProgressRecord.from_json(message.value)
        except (ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable progress record: %s", exc)
            return ()
        state = self._state
        before = state.book
        state.book = reports.progress_reported(
            state.book,
            record.step,
            record.round_id,
            ProgressSettings.from_config(self._config),
            self._clock(),
            record.commit_round,
            state.plan,
        )
        if state.book is not before:  # (taken: an older round's record leaves it as it is)
            book = state.book
            state.book = replace(book, progress=book.progress.written_by(record.worker_id))
        return ()

    def on_finished(self, message: msg.TrainingFinished) -> Decisions:
        """The job's finish record was written (``on_training_finished``)."""
        return self.on_training_finished(message.record)

    def on_training_finished(self, finish: bytes) -> Decisions:
        """A worker's finish record (``JobKeys.training_finished``, or its own
        ``finished/<id>``): the training is complete, and its commit is the job's
        result. Said once; the step it ended at is the job's last word on progress
        (rank 0's last report may be up to a report period older)."""
        state = self._state
        if state.book.training_done:
            return ()
        now = self._clock()
        state.book = state.book.training_finished(now)
        try:
            record = FinishRecord.from_json(finish)
        except (ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable finish record: %s", exc)
            return ()
        if record.commits or state.book.progress.step is not None:  # (0: no state committed)
            progress = ProgressSettings.from_config(self._config)
            state.book = reports.progress_reported(
                state.book, record.commits, record.round, progress, now
            )
        rec = state.workers.get(record.worker)
        self._events.emit(
            ev.TrainingFinished(
                round=record.round,
                step=record.commits,
                worker=record.worker,
                host=rec.host if rec is not None else "",
                slot=rec.slot if rec is not None else -1,
            )
        )
        return ()

    def on_snapshot(self, message: msg.SnapshotReported) -> Decisions:
        """What a worker's snapshot said: say it, and keep the newest complete one of
        each host (the round rules resume from it when the state's holders are lost)."""
        record, state = message.record, self._state
        if record is None:
            return ()
        if message.kind == "done":
            state.book = state.book.snapshot_complete(record.host, record.step, record.round_id)
            event: ev.Event = ev.SnapshotWritten(
                record.step,
                record.round_id,
                record.path,
                record.host,
                record.seconds,
                record.bytes,
                record.final,
            )
        elif message.kind == "loaded":
            state.book = state.book.snapshot_complete(record.host, record.step)
            event = ev.SnapshotResumed(record.step, record.round_id, record.path, record.host)
        else:
            held = [s.step for s in state.book.progress.snapshots if s.host in ("", record.host)]
            previous = max(held) if held else None
            event = ev.SnapshotFailed(record.step, record.path, record.host, record.error, previous)
        self._events.emit(event)
        return ()

    def on_preempted(self, message: msg.HostPreempted) -> Decisions:
        """The scheduler takes a host back: a snapshot first, then its workers stop
        (``driver.policy.preemption``)."""
        state = self._state
        if self._config.restart_workers:  # no snapshot, no handover: the world ends with it
            return restarts.world_host_preempted(state.workers, message.host)
        snapshots = bool(self._config.checkpoint_dir)
        step = preemption.host_preempted(
            state.workers,
            state.plan,
            state.book,
            message.host,
            snapshots,
            self._clock(),
            self._config.min_np,
        )
        return state.take(step)

    def on_chaos_tick(self, message: msg.ChaosTick) -> Decisions:
        state, chaos = self._state, self._chaos
        cfg = self._config
        candidates = occupancy.chaos_candidates(
            state.workers, state.plan, state.book, cfg.min_np, cfg.np, cfg.chaos_below_min_np
        )
        victim = chaos.strike(candidates) if chaos and candidates else None
        if victim is None or chaos is None:
            return ()
        pid = self._held.pid(victim)
        return occupancy.chaos_kill(state.workers[victim], state.plan, pid, chaos.kills)
