"""What the workers' side tells the driver's main loop, turned into the job's state and
the rules' decisions: a process exit, a registration (or its end), a failure or
silence report, a probe's answer, a lost agent, rank 0's progress, a chaos tick.

``MessageHandlers`` is given what it uses: the job's state, the services (the store,
the chaos), the keys, the processes, the event sink, a clock, and ``apply`` to carry
out the decisions; the main loop (``driver.job.loop``) dispatches these messages to it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Callable

from driver import events as ev
from driver import policy
from driver.job import messages as msg
from driver.job.processes import WorkerProcesses
from driver.job.services import JobServices
from driver.job.state import JobState
from driver.lead.adopted_pids import AdoptedProcesses
from driver.policy import decisions as dec
from driver.policy import lifecycle
from rendezvous.keys import JobKeys
from rendezvous.plan import ProgressRecord, WorkerInfo
from rendezvous.store import PUT, KeyValue

log = logging.getLogger(__name__)


class MessageHandlers:
    """One handler per message about the workers."""

    def __init__(
        self,
        state: JobState,
        services: JobServices,
        keys: JobKeys,
        command: Sequence[str],
        *,
        processes: WorkerProcesses,
        adopted: AdoptedProcesses,
        events: ev.EventSink,
        clock: Callable[[], float],
        apply: Callable[[Sequence[dec.Decision]], None],
    ):
        self._state = state
        self._services = services
        self._keys = keys
        self._command = command
        self._processes = processes
        self._adopted = adopted
        self._events = events
        self._clock = clock
        self._apply = apply

    def on_exit(self, message: msg.ProcessExited) -> None:
        state, keys = self._state, self._keys
        rec = state.workers.get(message.worker_id)
        if rec is None or not rec.state.running:
            return  # an adopted worker's end, seen twice (its pid, a kill that gave it up)
        if rec.info is not None:
            # Do not wait for its lease: the process is gone.
            self._services.delete_quietly(keys.worker(rec.worker_id))
        # An exit 0 after the worker's @elastic.run function returned: training is done.
        returned = self._services.has_key(keys.finished(rec.worker_id))
        state.workers[rec.worker_id], (decisions, state.book) = policy.worker_exited(
            rec,
            message.code,
            state.plan,
            state.book,
            self._clock(),
            command=self._command,
            any_registered=state.any_registered(),
            trained_to_end=returned and message.code == 0,
        )
        if returned and message.code != 0 and not state.book.done_slots:
            # Its training returned, then it failed: a finish counts once its worker exits
            # 0, so the job goes on as if it had not finished (relaunch, re-form, and the
            # rules for workers failing at their end).
            self._services.delete_quietly(keys.finished(rec.worker_id))
            self._services.delete_quietly(keys.training_finished)
            state.book = replace(state.book, training_done=False)
        self._apply(decisions)

    def on_registry(self, message: msg.RegistryChanged) -> None:
        event = message.event
        worker_id = event.key[len(self._keys.workers) :]
        self._set_registration(worker_id, event.kv if event.type == PUT else None)

    def on_registry_resync(self, message: msg.RegistryResync) -> None:
        """The registrations as read afresh after the registry watch was lost."""
        registered = {kv.key[len(self._keys.workers) :]: kv for kv in message.kvs}
        for rec in list(self._state.workers.values()):
            if rec.state.running and (rec.worker_id in registered or rec.info is not None):
                self._set_registration(rec.worker_id, registered.get(rec.worker_id))

    def _set_registration(self, worker_id: str, kv: KeyValue | None) -> None:
        """Worker ``worker_id`` is registered as ``kv``, or no longer (None)."""
        state = self._state
        rec = state.workers.get(worker_id)
        if rec is None or not rec.state.running:
            return
        now = self._clock()
        if kv is None and self._adopted.lapsed(worker_id):
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

    def on_failure_report(self, message: msg.FailureReport) -> None:
        if message.event.type != PUT:
            return
        state = self._state
        report = json.loads(message.event.value)
        if report.get("silent"):
            decisions, state.book = policy.silence_reported(
                state.workers, state.plan, state.book, report
            )
            self._apply(decisions)
        else:
            self._apply(
                state.take(
                    policy.failure_reported(
                        state.workers, state.plan, state.book, report, self._clock()
                    )
                )
            )

    def on_probe_answered(self, message: msg.ProbeAnswered) -> None:
        state = self._state
        decisions, state.book = policy.probe_answered(
            state.workers, state.book, message.host, message.reachable, message.detail
        )
        self._apply(decisions)

    def on_agent_lost(self, message: msg.AgentLost) -> None:
        """A host whose agent stopped answering is lost, as a host that does not answer
        a probe: its workers are dropped at once and the host blacklisted."""
        self.on_probe_answered(msg.ProbeAnswered(message.host, False, message.detail))

    def on_progress(self, message: msg.ProgressReported) -> None:
        try:
            record = ProgressRecord.from_json(message.value)
        except (ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable progress record: %s", exc)
            return
        self._state.book = self._state.book.progressed(record.step, self._clock())

    def on_chaos_tick(self, message: msg.ChaosTick) -> None:
        state, chaos = self._state, self._services.chaos
        candidates = policy.chaos_candidates(state.workers, state.plan, state.book)
        victim = chaos.strike(candidates) if chaos and candidates else None
        if victim is not None and chaos is not None:
            pid = self._adopted.pid(victim) if victim in self._adopted else None
            pid, kills = pid or self._processes.pid(victim), chaos.kills
            self._apply(policy.chaos_kill(state.workers[victim], state.plan, pid, kills))
