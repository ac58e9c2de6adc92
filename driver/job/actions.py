"""The rules' decisions about one worker's process, carried out: start it in a slot
or as a spare, promote a spare, stop it, kill it, whichever holds it (this driver's
launcher, ``driver.job.processes``, or its pid for a worker adopted from its
registration alone, ``driver.lead.adopted_pids``); its record follows
(``driver.policy.lifecycle``). In restart mode, a whole world of them started at once
(``start_world``).

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
from driver.job.lead import JobLead
from driver.job.wiring import (
    names_are_labels,
    seat_env,
    worker_bind_host,
    worker_spec,
    world_spare_spec,
    world_spec,
)
from driver.launch.spec import LaunchSpec
from driver.policy import decisions as dec
from driver.policy import lifecycle, planner
from driver.policy.lifecycle import WorkerRecord
from driver.policy.planner import World
from rendezvous.plan import WorldSeat
from rendezvous.store import Put

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

    def bind_host(self, host: str) -> str:
        """What a worker on ``host`` binds its listener to and advertises
        (``driver.job.wiring.worker_bind_host``)."""
        ctx = self._ctx
        labels = names_are_labels(ctx.config)
        return worker_bind_host(host, ctx.all_local, ctx.services.advertised_host, labels)

    def start_process(
        self, worker_id: str, host: str, slot: int, spec: LaunchSpec, spare: bool = False
    ) -> int:
        """Start ``spec`` as worker ``worker_id`` in ``slot`` of ``host`` (a spare: its
        spare index); its record and its ``worker_started`` follow. Returns its pid.

        Raises:
            LeadershipLost: another driver leads the job.
            LauncherError: it cannot be started.
        """
        ctx = self._ctx
        ctx.services.claim.check()  # a driver that lost the lead starts nothing
        pid = ctx.processes.start(worker_id, spec)
        now = ctx.clock()
        ctx.state.workers[worker_id] = WorkerRecord.launched(worker_id, host, slot, now, spare)
        ctx.events.emit(ev.WorkerStarted(worker_id, host, slot, pid, spare))
        return pid

    def _start(self, host: str, slot: int, spare: bool) -> Decisions:
        """Start a worker in ``slot`` of ``host``, or (``spare``) the host's spare number
        ``slot``: one route for both. Returns what a failed start leads to."""
        ctx = self._ctx
        state, services = ctx.state, ctx.services
        services.claim.check()  # a driver that lost the lead makes no id, starts nothing
        worker_id = ctx.processes.new_id(host, f"s{slot}" if spare else slot)
        bind = self.bind_host(host)
        if spare and ctx.config.restart_workers:  # a spare that waits for a world's seat
            spec = world_spare_spec(
                ctx.config, ctx.secret, services.store_url, worker_id, host, slot, bind
            )
        else:
            spec = worker_spec(
                ctx.config, ctx.secret, services.store_url, worker_id, host, slot, bind, spare
            )
        try:
            self.start_process(worker_id, host, slot, spec, spare)
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
        return ()

    def start_world(self, decision: dec.StartWorld, lead: JobLead) -> Decisions:
        """Start every worker of ``decision.world`` (restart mode,
        ``driver.policy.restarts``), in rank order, each told its ranks
        (``driver.job.wiring.world_spec``), after ``lead`` cleared what earlier worlds'
        workers left in the store (their rank 0's address: a new world must meet its
        own); then ``lead`` makes the world the job's round (the plan the rules and the
        agents read). A worker that cannot be started ends the world at once, as a
        failure (``policy.world_launch_failed``): the plan is then of the workers that
        did start, which the next turn of the rules stops. Returns what the failed start
        leads to.

        Raises:
            LeadershipLost: another driver leads the job.
            RendezvousError: the store cannot be used.
        """
        ctx, world = self._ctx, decision.world
        lead.clear_worlds()
        started: list[str] = []
        failed: list[dec.Decision] = []
        spares = policy.world_spares(world, ctx.state.workers)
        self._seat_spares(spares, world)
        for seat in world.seats:
            spare = spares.get(seat.rank)
            if spare is not None:
                self.promote(dec.Promote(spare, seat.host, seat.slot))
                started.append(spare)
                continue
            worker_id = ctx.processes.new_id(seat.host, seat.slot)
            bind = self.bind_host(seat.host)
            try:
                spec = world_spec(
                    ctx.config, ctx.secret, ctx.services.store_url, worker_id, world, seat, bind
                )
                self.start_process(worker_id, seat.host, seat.slot, spec)
            except LauncherError as exc:
                permanent = isinstance(exc, LaunchError) and exc.permanent
                failed += policy.launch_failed(
                    worker_id, seat.host, seat.slot, str(exc), None, False, permanent
                )
                ctx.state.book = policy.world_launch_failed(ctx.state.book, str(exc))
                break  # the world cannot be whole: its others would only wait for rank 0
            started.append(worker_id)
        lead.publish_world(planner.world_plan(world, started))
        ctx.state.book = policy.spares_held_for_world(ctx.state.book, world.hosts, ctx.clock())
        if not failed:
            ctx.events.emit(
                ev.WorldStarted(
                    world.number, world.restarts, world.size, world.hosts, started, decision.seconds
                )
            )
        return failed

    def _seat_spares(self, spares: dict[int, str], world: World) -> None:
        """Give each warm spare of ``spares`` (by rank; restart mode) its seat of
        ``world`` under ``JobKeys.world_seat``, where it waits: one fenced write for all.

        Raises:
            LeadershipLost: another driver leads the job.
            RendezvousError: the store cannot be used.
        """
        if not spares:
            return
        ctx = self._ctx
        seats = {seat.rank: seat for seat in world.seats}
        ctx.services.steer(
            [
                Put(
                    ctx.keys.world_seat(worker_id),
                    WorldSeat(world.number, seat_env(ctx.config, world, seats[rank])).to_json(),
                )
                for rank, worker_id in spares.items()
            ]
        )

    def promote(self, decision: dec.Promote) -> Decisions:
        state, now = self._ctx.state, self._ctx.clock()
        rec = state.workers[decision.worker_id]
        self._ctx.events.emit(policy.promotion_event(rec, decision.slot, now))
        state.workers[rec.worker_id] = lifecycle.promoted(rec, decision.slot, now)
        whole_world = self._ctx.config.restart_workers
        state.book = policy.spare_promoted(state.book.changed(now), rec.host, now, whole_world)
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
