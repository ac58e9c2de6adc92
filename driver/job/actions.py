"""The rules' decisions about one worker's process, carried out: start it in a slot
or as a spare, promote a spare, stop it, kill it, whichever holds it (this driver's
launcher, ``driver.job.processes``, or its pid for a worker adopted from its
registration alone, ``driver.lead.adopted_pids``); its record follows
(``driver.policy.lifecycle``).

``WorkerActions`` works over the job's context (``driver.job.context``): the state, the
services (the claim that fences each action, the store URL and address the workers are
given), the processes, the event sink, the clock. Each action returns the decisions it
leads to (a launch that fails: the rules' answer to it), for the loop to carry out; none
calls back into the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from driver import events as ev
from driver import policy
from driver.errors import LauncherError, LaunchError
from driver.job.context import JobContext
from driver.job.wiring import names_are_labels, worker_bind_host, worker_spec
from driver.policy import decisions as dec
from driver.policy import lifecycle
from driver.policy.lifecycle import WorkerRecord

log = logging.getLogger(__name__)

Decisions = Sequence[dec.Decision]


class WorkerActions:
    """Start, promote, stop and kill workers, for the main loop (``driver.job.loop``).

    Each action but ``promote`` is fenced on the lead first.

    Raises (``launch``, ``launch_spare``, ``kill``, ``stop``):
        LeadershipLost: another driver leads the job (this one starts, stops and kills
            nothing more).
    """

    def __init__(self, ctx: JobContext):
        self._ctx = ctx

    def launch(self, decision: dec.Launch) -> Decisions:
        return self._start(decision.host, decision.slot, spare=False)

    def launch_spare(self, decision: dec.LaunchSpare) -> Decisions:
        return self._start(decision.host, decision.index, spare=True)

    def _start(self, host: str, slot: int, spare: bool) -> Decisions:
        """Start a worker in ``slot`` of ``host``, or (``spare``) the host's spare number
        ``slot``: one route for both. Returns what a failed start leads to."""
        ctx = self._ctx
        state, services = ctx.state, ctx.services
        services.claim.check()  # a driver that lost the lead starts nothing
        worker_id = ctx.processes.new_id(host, f"s{slot}" if spare else slot)
        labels = names_are_labels(ctx.config)
        bind = worker_bind_host(host, ctx.all_local, services.advertised_host, labels)
        spec = worker_spec(
            ctx.config, ctx.secret, services.store_url, worker_id, host, slot, bind, spare
        )
        try:
            pid = ctx.processes.start(worker_id, spec)
        except LauncherError as exc:
            if spare:
                step = policy.spare_launch_failed(
                    worker_id, host, str(exc), state.book, ctx.clock()
                )
                return state.take(step)
            permanent = isinstance(exc, LaunchError) and exc.permanent
            return policy.launch_failed(
                worker_id, host, slot, str(exc), None, state.any_registered(), permanent
            )
        now = ctx.clock()
        state.workers[worker_id] = WorkerRecord.launched(worker_id, host, slot, now, spare)
        ctx.events.emit(ev.WorkerStarted(worker_id, host, slot, pid, spare))
        return ()

    def promote(self, decision: dec.Promote) -> Decisions:
        state, now = self._ctx.state, self._ctx.clock()
        rec = state.workers[decision.worker_id]
        self._ctx.events.emit(policy.promotion_event(rec, decision.slot, now))
        state.workers[rec.worker_id] = lifecycle.promoted(rec, decision.slot, now)
        state.book = policy.spare_promoted(state.book.changed(now), rec.host, now)
        return ()

    def kill(self, decision: dec.Kill) -> Decisions:
        ctx = self._ctx
        state = ctx.state
        rec = state.workers.get(decision.worker_id)
        if rec is None or not rec.state.running:
            return ()
        log.info("killing worker %s: %s", rec.worker_id, decision.reason)
        ctx.services.claim.check()
        if rec.worker_id in ctx.adopted:
            ctx.adopted.kill(rec.worker_id)
        else:
            ctx.processes.kill(rec.worker_id)
        now = ctx.clock()
        state.workers[rec.worker_id] = lifecycle.killed(
            rec, now, chaos=decision.chaos, reason=decision.reason
        )
        if state.plan is not None and state.plan.member(rec.worker_id) is not None:
            state.book = state.book.changed(now)
        return ()

    def stop(self, decision: dec.Stop) -> Decisions:
        ctx = self._ctx
        rec = ctx.state.workers[decision.worker_id]
        ctx.services.claim.check()
        ctx.state.workers[rec.worker_id] = lifecycle.stopping(rec, ctx.clock())
        if rec.worker_id in ctx.adopted:
            ctx.adopted.stop(rec.worker_id)
        else:
            ctx.processes.stop(rec.worker_id)
        return ()

    def leave(self, decision: dec.Leave) -> Decisions:
        """Count the worker as stopping (its exit is no failure) and give it until
        ``decision.until`` to leave at its next commit; nothing is sent to it."""
        ctx, state = self._ctx, self._ctx.state
        rec = state.workers[decision.worker_id]
        log.info("worker %s leaves at its next commit: %s", rec.worker_id, decision.reason)
        state.workers[rec.worker_id] = lifecycle.stopping(rec, ctx.clock())
        state.book = state.book.leaves(rec.worker_id, decision.until)
        return ()

    def stop_all(self) -> None:
        """Stop every running worker (the job's end)."""
        ctx = self._ctx
        running = [r.worker_id for r in ctx.state.workers.values() if r.state.running]
        ctx.adopted.stop_all([w for w in running if w in ctx.adopted])
        ctx.processes.stop_all([w for w in running if w not in ctx.adopted])
