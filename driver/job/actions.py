"""The rules' decisions about one worker's process, carried out: start it in a slot
or as a spare, promote a spare, stop it, kill it, whichever holds it (this driver's
launcher, ``driver.job.processes``, or its pid for a worker adopted from its
registration alone, ``driver.lead.adopted_pids``); its record follows (``driver.policy.lifecycle``).

``WorkerActions`` is given what it uses: the job's state, the services (the claim that
fences each action, the store URL and address the workers are given), the processes,
the event sink, a clock, and ``apply`` for the decisions a failed launch leads to.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Callable

from driver import events as ev
from driver import policy
from driver.config import JobConfig
from driver.errors import LauncherError, LaunchError
from driver.job.processes import WorkerProcesses
from driver.job.services import JobServices
from driver.job.state import JobState
from driver.job.wiring import worker_bind_host, worker_spec
from driver.lead.adopted_pids import AdoptedProcesses
from driver.policy import decisions as dec
from driver.policy import lifecycle
from driver.policy.lifecycle import WorkerRecord

log = logging.getLogger(__name__)


class WorkerActions:
    """Start, promote, stop and kill workers, for the main loop (``driver.job.loop``)."""

    def __init__(
        self,
        state: JobState,
        services: JobServices,
        config: JobConfig,
        secret: str,
        *,
        processes: WorkerProcesses,
        adopted: AdoptedProcesses,
        events: ev.EventSink,
        clock: Callable[[], float],
        all_local: bool,
        apply: Callable[[Sequence[dec.Decision]], None],
    ):
        self._state = state
        self._services = services
        self._config = config
        self._secret = secret
        self._processes = processes
        self._adopted = adopted
        self._events = events
        self._clock = clock
        self._all_local = all_local
        self._apply = apply

    def launch(self, decision: dec.Launch) -> None:
        self._start(decision.host, decision.slot, spare=False)

    def launch_spare(self, decision: dec.LaunchSpare) -> None:
        self._start(decision.host, decision.index, spare=True)

    def _start(self, host: str, slot: int, spare: bool) -> None:
        """Start a worker in ``slot`` of ``host``, or (``spare``) the host's spare number
        ``slot``: one route for both."""
        state = self._state
        self._services.claim.check()  # a driver that lost the lead starts nothing
        worker_id = self._processes.new_id(host, f"s{slot}" if spare else slot)
        bind = worker_bind_host(host, self._all_local, self._services.advertised_host)
        spec = worker_spec(
            self._config,
            self._secret,
            self._services.store_url,
            worker_id,
            host,
            slot,
            bind,
            spare,
        )
        try:
            pid = self._processes.start(worker_id, spec)
        except LauncherError as exc:
            if spare:
                step = policy.spare_launch_failed(
                    worker_id, host, str(exc), state.book, self._clock()
                )
                self._apply(state.take(step))
                return
            permanent = isinstance(exc, LaunchError) and exc.permanent
            self._apply(
                policy.launch_failed(
                    worker_id, host, slot, str(exc), None, state.any_registered(), permanent
                )
            )
            return
        now = self._clock()
        state.workers[worker_id] = WorkerRecord.launched(worker_id, host, slot, now, spare)
        self._events.emit(ev.WorkerStarted(worker_id, host, slot, pid, spare))

    def promote(self, decision: dec.Promote) -> None:
        state = self._state
        rec, now = state.workers[decision.worker_id], self._clock()
        self._events.emit(policy.promotion_event(rec, decision.slot, now))
        state.workers[rec.worker_id] = lifecycle.promoted(rec, decision.slot, now)
        state.book = policy.spare_promoted(state.book.changed(now), rec.host, now)

    def kill(self, decision: dec.Kill) -> None:
        state = self._state
        rec = state.workers.get(decision.worker_id)
        if rec is None or not rec.state.running:
            return
        log.info("killing worker %s: %s", rec.worker_id, decision.reason)
        self._services.claim.check()
        if rec.worker_id in self._adopted:
            self._adopted.kill(rec.worker_id)
        else:
            self._processes.kill(rec.worker_id)
        now = self._clock()
        state.workers[rec.worker_id] = lifecycle.killed(
            rec, now, chaos=decision.chaos, reason=decision.reason
        )
        if state.plan is not None and state.plan.member(rec.worker_id) is not None:
            state.book = state.book.changed(now)

    def stop(self, decision: dec.Stop) -> None:
        state = self._state
        rec = state.workers[decision.worker_id]
        self._services.claim.check()
        state.workers[rec.worker_id] = lifecycle.stopping(rec, self._clock())
        if rec.worker_id in self._adopted:
            self._adopted.stop(rec.worker_id)
        else:
            self._processes.stop(rec.worker_id)

    def stop_all(self) -> None:
        """Stop every running worker (the job's end)."""
        running = [r.worker_id for r in self._state.workers.values() if r.state.running]
        self._adopted.stop_all([w for w in running if w in self._adopted])
        self._processes.stop_all([w for w in running if w not in self._adopted])
