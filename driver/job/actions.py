"""The rules' decisions about one worker's process, carried out: start it in a slot
or as a spare, promote a spare, stop it, kill it, whichever holds it (this driver's
launcher, ``driver.job.processes``, or its pid for a worker adopted from its
registration alone, ``driver.leadership.adopted_pids``); its record follows
(``driver.policy.lifecycle``). In restart mode, a whole world of them started at once
(``start_world``).

``WorkerActions`` is given what it uses: the job's state, its store session (what the
workers are started with, ``driver.job.session``), the fenced writes that check the lead
before each action (``driver.job.fenced``), the held workers, the lead (which publishes
a world: ``driver.job.lead``), the event sink, the clock. Each action returns the
decisions it leads to (a launch that fails: the rules' answer to it), for the loop to
carry out; none calls back into the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Callable

from driver import events as ev
from driver.errors import LauncherError, LaunchError
from driver.job.lead import JobLead
from driver.job.wiring import WorkerSeat, seat_env, worker_spec, world_spare_spec, world_spec
from driver.job.worker_parts import WorkerParts
from driver.launch.spec import LaunchSpec
from driver.policy import decisions as dec
from driver.policy import lifecycle, planner
from driver.policy.exits import launch_failed
from driver.policy.lifecycle import WorkerRecord
from driver.policy.planner import World
from driver.policy.restarts import world_launch_failed, world_spares
from driver.policy.spares import (
    promotion_event,
    spare_launch_failed,
    spare_promoted,
    spares_held_for_world,
)
from rendezvous.schema.worlds import WorldSeat
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

    def __init__(
        self,
        parts: WorkerParts,
        lead: JobLead,
        events: ev.EventSink,
        clock: Callable[[], float],
    ):
        self._state, self._session = parts.state, parts.session
        self._fenced, self._held = parts.fenced, parts.held
        self._lead = lead
        self._events = events
        self._clock = clock
        self._config = parts.session.config

    def launch(self, decision: dec.Launch) -> Decisions:
        return self._start(decision.host, decision.slot, spare=False)

    def launch_spare(self, decision: dec.LaunchSpare) -> Decisions:
        return self._start(decision.host, decision.index, spare=True)

    def start_process(
        self, worker_id: str, host: str, slot: int, spec: LaunchSpec, spare: bool = False
    ) -> int:
        """Start ``spec`` as worker ``worker_id`` in ``slot`` of ``host`` (a spare: its
        spare index); its record and its ``worker_started`` follow. Returns its pid.

        Raises:
            LeadershipLost: another driver leads the job.
            LauncherError: it cannot be started.
        """
        self._fenced.check()  # a driver that lost the lead starts nothing
        pid = self._held.processes.start(worker_id, spec)
        now = self._clock()
        self._state.workers[worker_id] = WorkerRecord.launched(worker_id, host, slot, now, spare)
        self._events.emit(ev.WorkerStarted(worker_id, host, slot, pid, spare))
        return pid

    def _start(self, host: str, slot: int, spare: bool) -> Decisions:
        """Start a worker in ``slot`` of ``host``, or (``spare``) the host's spare number
        ``slot``: one route for both. Returns what a failed start leads to."""
        state, session = self._state, self._session
        self._fenced.check()  # a driver that lost the lead makes no id, starts nothing
        worker_id = self._held.processes.new_id(host, f"s{slot}" if spare else slot)
        seat = WorkerSeat(worker_id, host, slot, session.bind_host(host), spare)
        if spare and self._config.restart_workers:  # a spare that waits for a world's seat
            spec = world_spare_spec(session.wiring, seat)
        else:
            spec = worker_spec(session.wiring, seat)
        try:
            self.start_process(worker_id, host, slot, spec, spare)
        except LauncherError as exc:
            if spare:
                step = spare_launch_failed(worker_id, host, str(exc), state.book, self._clock())
                return state.take(step)
            permanent = isinstance(exc, LaunchError) and exc.permanent
            return launch_failed(
                worker_id, host, slot, str(exc), None, state.any_registered(), permanent
            )
        return ()

    def start_world(self, decision: dec.StartWorld) -> Decisions:
        """Start every worker of ``decision.world`` (restart mode,
        ``driver.policy.restarts``), in rank order, each told its ranks
        (``driver.job.wiring.world_spec``), after the lead cleared what earlier worlds'
        workers left in the store (their rank 0's address: a new world must meet its
        own); then the lead makes the world the job's round (the plan the rules and the
        agents read). A worker that cannot be started ends the world at once, as a
        failure (``policy.world_launch_failed``): the plan is then of the workers that
        did start, which the next turn of the rules stops. Returns what the failed start
        leads to.

        Raises:
            LeadershipLost: another driver leads the job.
            RendezvousError: the store cannot be used.
        """
        world, session, lead = decision.world, self._session, self._lead
        lead.clear_worlds()
        started: list[str] = []
        failed: list[dec.Decision] = []
        spares = world_spares(world, self._state.workers)
        self._seat_spares(spares, world)
        for seat in world.seats:
            spare = spares.get(seat.rank)
            if spare is not None:
                self.promote(dec.Promote(spare, seat.host, seat.slot))
                started.append(spare)
                continue
            worker_id = self._held.processes.new_id(seat.host, seat.slot)
            worker = WorkerSeat(worker_id, seat.host, seat.slot, session.bind_host(seat.host))
            try:
                spec = world_spec(session.wiring, worker, world, seat)
                self.start_process(worker_id, seat.host, seat.slot, spec)
            except LauncherError as exc:
                permanent = isinstance(exc, LaunchError) and exc.permanent
                failed += launch_failed(
                    worker_id, seat.host, seat.slot, str(exc), None, False, permanent
                )
                self._state.book = world_launch_failed(self._state.book, str(exc))
                break  # the world cannot be whole: its others would only wait for rank 0
            started.append(worker_id)
        lead.publish_world(planner.world_plan(world, started))
        self._state.book = spares_held_for_world(self._state.book, world.hosts, self._clock())
        if not failed:
            self._events.emit(
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
        seats = {seat.rank: seat for seat in world.seats}
        self._fenced.steer(
            [
                Put(
                    self._session.keys.world_seat(worker_id),
                    WorldSeat(world.number, seat_env(self._config, world, seats[rank])).to_json(),
                )
                for rank, worker_id in spares.items()
            ]
        )

    def promote(self, decision: dec.Promote) -> Decisions:
        state, now = self._state, self._clock()
        rec = state.workers[decision.worker_id]
        self._events.emit(promotion_event(rec, decision.slot, now))
        state.workers[rec.worker_id] = lifecycle.promoted(rec, decision.slot, now)
        whole_world = self._config.restart_workers
        state.book = spare_promoted(state.book.changed(now), rec.host, now, whole_world)
        return ()

    def kill(self, decision: dec.Kill) -> Decisions:
        state = self._state
        rec = state.workers.get(decision.worker_id)
        if rec is None or not rec.state.running:
            return ()
        log.info("killing worker %s: %s", rec.worker_id, decision.reason)
        self._fenced.check()
        self._held.kill(rec.worker_id)
        now = self._clock()
        state.workers[rec.worker_id] = lifecycle.killed(
            rec, now, chaos=decision.chaos, reason=decision.reason
        )
        if state.plan is not None and state.plan.member(rec.worker_id) is not None:
            state.book = state.book.changed(now)
        return ()

    def stop(self, decision: dec.Stop) -> Decisions:
        rec = self._state.workers[decision.worker_id]
        self._fenced.check()
        self._state.workers[rec.worker_id] = lifecycle.stopping(rec, self._clock())
        self._held.stop(rec.worker_id)
        return ()

    def leave(self, decision: dec.Leave) -> Decisions:
        """Count the worker as stopping (its exit is no failure) and give it until
        ``decision.until`` to leave at its next commit; nothing is sent to it."""
        state = self._state
        rec = state.workers[decision.worker_id]
        log.info("worker %s leaves at its next commit: %s", rec.worker_id, decision.reason)
        state.workers[rec.worker_id] = lifecycle.stopping(rec, self._clock())
        state.book = state.book.leaves(rec.worker_id, decision.until)
        return ()

    def stop_all(self) -> None:
        """Stop every running worker (the job's end)."""
        self._held.stop_all([r.worker_id for r in self._state.workers.values() if r.state.running])
