"""What the leading driver writes and takes over: the job's rounds, its persisted state
(``JobKeys.driver_state``, fenced by the leader's term), and a job taken over from a
predecessor's records (``driver.leadership.persisted``).

``JobLead`` is given what it uses: the job's state, its store session
(``driver.job.session``: the claim, the keys, what a predecessor left), the fenced
writes (``driver.job.fenced``), the hosts, the held workers, the event sink, the
clock. The main
loop (``driver.job.loop``) calls it for a ``Publish`` decision, after each reconcile
(``persist``) and once at ``open`` when the claim adopts the job (``adopt``). The end of
a worker adopted by its pid alone comes back to the loop as an exit, through
``adopted_exit_reporter``.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Callable

from driver import events as ev
from driver.errors import JobFailed
from driver.hosts.manager import HostManager
from driver.hosts.slots import hosts_in_use
from driver.job import messages as msg
from driver.job.fenced import FencedStore
from driver.job.processes import HeldWorkers
from driver.job.session import StoreSession
from driver.job.state import JobState
from driver.launch.process import WorkerProcess
from driver.leadership import persisted
from driver.leadership.adopted_pids import EXIT_UNKNOWN
from driver.leadership.terms import describe_leader
from driver.policy import decisions as dec
from driver.policy import lifecycle
from driver.policy.lifecycle import WorkerRecord
from rendezvous import env
from rendezvous.errors import RendezvousError
from rendezvous.host_plan import plan_ops
from rendezvous.keys import JobKeys
from rendezvous.net.addresses import is_local_host
from rendezvous.net.auth import secret_fingerprint
from rendezvous.schema.leader import DriverStateRecord
from rendezvous.schema.rounds import Plan
from rendezvous.store import Delete, Put

log = logging.getLogger(__name__)


def adopted_exit_reporter(
    fenced: FencedStore, keys: JobKeys, post: Callable[[msg.Message], None]
) -> Callable[[str], None]:
    """What tells the loop that a worker adopted by its pid alone is gone (called from a
    helper thread, ``driver.leadership.adopted_pids``): its exit, code unknown, unless it said
    it finished its training (then 0)."""

    def gone(worker_id: str) -> None:
        finished = fenced.has_key(keys.finished(worker_id))
        post(msg.ProcessExited(worker_id, 0 if finished else EXIT_UNKNOWN))

    return gone


STATE_WRITE_INTERVAL = 0.5
"""Seconds between two writes of the driver's persisted state (``JobKeys.driver_state``)
when it keeps changing; a change is written at most this late."""


class JobLead:
    """The lead's writes and the takeover of a job."""

    def __init__(
        self,
        state: JobState,
        session: StoreSession,
        fenced: FencedStore,
        hosts: HostManager,
        held: HeldWorkers,
        events: ev.EventSink,
        clock: Callable[[], float],
    ):
        self._state = state
        self._session = session
        self._fenced = fenced
        self._hosts = hosts
        self._held = held
        self._events = events
        self._clock = clock
        self._config = session.config
        self._state_written: DriverStateRecord | None = None
        self._state_due = 0.0  # the next write of the persisted state, not before

    def adopt(self, handed_over: dict[str, WorkerProcess]) -> None:
        """Take the job over from the store's records (``driver.leadership.persisted``): its plan,
        its registered workers, the book and the blacklist. A worker's process is the
        handle its agent's records gave (``handed_over``, by worker id), else known
        from its registration alone (``driver.leadership.adopted_pids``).

        Raises:
            JobFailed: this driver does not have the job's secret (it steps down first,
                leaving the job as it is for a driver that has).
        """
        state, claim, now = self._state, self._session.claim, self._clock()
        view = persisted.rebuild_view(
            self._session.snapshot, self._session.keys, now=now, wall_now=time.time()
        )
        if view.secret_id and view.secret_id != secret_fingerprint(self._session.secret):
            claim.step_down()
            raise JobFailed(
                f"cannot take over job {self._config.job_id!r}: this driver does not have the "
                "job's secret; start it with ELASTIC_JOB_SECRET set as it was for the job's "
                "first driver (the job was left as it is)"
            )
        state.plan, state.book = view.plan, view.book
        state.workers.clear()
        state.workers.update(view.workers)
        for c in view.cooldowns:
            self._hosts.restore(c.host, c.strikes, c.until)
        self._held.processes.continue_ids_after(view.launched)
        for worker_id, (host, pid) in view.pids.items():
            rec = state.workers[worker_id]
            if not rec.state.running:
                continue
            process = handed_over.get(worker_id)
            if process is not None:
                self._events.emit(ev.WorkerAdopted(worker_id, rec.host, rec.slot, process.pid))
                self._held.processes.adopt(worker_id, process)
                continue
            self._events.emit(ev.WorkerAdopted(worker_id, rec.host, rec.slot, pid))
            self._held.adopted.adopt(
                worker_id, pid, local=self._session.all_local or is_local_host(host)
            )
        for worker_id, process in handed_over.items():
            # Launched by the predecessor, running, not registered yet: it joins later.
            # In restart mode none ever registers: a member of the world runs when its
            # agent says so (the world goes on, or stops when a member is gone).
            known = state.workers.get(worker_id)
            unseen = known is not None and not known.state.running and self._config.restart_workers
            if (known is not None and not unseen) or env.ENV_WORKER_ID not in process.spec.env:
                continue
            spec = process.spec
            state.workers[worker_id] = WorkerRecord.launched(worker_id, spec.host, spec.slot, now)
            self._events.emit(ev.WorkerAdopted(worker_id, spec.host, spec.slot, process.pid))
            self._held.processes.adopt(worker_id, process)
        running = [(r.host, r.slot) for r in state.workers.values() if r.state.running]
        for host_event in self._hosts.keep_in_use(hosts_in_use(running)):
            self._events.emit(host_event)
        for rec in list(state.workers.values()):
            # What the predecessor was stopping or killing is asked again in this term
            # (an agent refuses its older term's request once it has seen ours).
            if rec.state.running and not rec.state.active:
                self._give_up_again(rec)
        previous = claim.taken.previous
        vacant_at = claim.taken.vacant_at
        self._events.emit(
            ev.Leading(
                claim.record.term,
                "adopted",
                sum(1 for r in state.workers.values() if r.state.running),
                describe_leader(previous) if previous is not None else "",
                round(time.monotonic() - vacant_at, 3) if vacant_at is not None else 0.0,
            )
        )

    def publish(self, decision: dec.Publish) -> Sequence[dec.Decision]:
        """Publish a round (one fenced write) and make it the job's. Leads to no other
        decision (the next turn of the rules sees the round)."""
        plan = replace(decision.plan, term=self._fenced.term())
        # One fenced write: the plan, the state that goes with it (its reset counted),
        # and the reports about older rounds, which this one settles; only while no
        # worker has recorded that its training returned: a round formed after that would
        # hand newcomers a finished training (JobKeys.training_finished).
        state = self._state_record()
        published = self._publish_plan(
            plan,
            [
                Put(self._session.keys.driver_state, state.to_json()),
                Delete(self._session.keys.failures, prefix=True),
            ],
            unless_finished=True,
        )
        if not published:
            log.info("round %d not formed: the training has finished", plan.round_id)
            self._state.book = self._state.book.training_finished(self._clock())
            return ()
        self._state_written = state
        self._state.plan = plan
        self._state.book = self._state.book.new_round(plan.round_id, plan.handover)
        self._held.processes.assign_ranks(plan)
        members = list(plan.worker_ids)
        self._events.emit(ev.RoundFormed(plan.round_id, plan.size, decision.seconds, members))
        return ()

    def _publish_plan(
        self, plan: Plan, also: Sequence[Put | Delete], *, unless_finished: bool
    ) -> bool:
        """Write ``plan`` as the job's round (``rendezvous.host_plan.plan_ops``: the
        whole plan, its head and each host's part) with ``also``, in one fenced
        transaction, only while no worker recorded that its training returned when
        ``unless_finished``; a large plan's parts are written first, fenced too (a part
        of a round never published is no part of it: its digest is not the head's), and
        the parts of many hosts it left out deleted after it.
        False when the training had finished (nothing published).

        Raises:
            LeadershipLost: another driver leads.
            RendezvousError: the store cannot be used.
        """
        fenced = self._fenced
        previous = self._state.plan
        writes = plan_ops(self._session.keys, plan, previous)
        for batch in writes.before:
            fenced.steer(batch)
        ops = [*writes.publish, *also]
        if not unless_finished:
            fenced.steer(ops)
        elif fenced.steer_unless(self._session.keys.training_finished, ops) is None:
            return False
        for batch in writes.after:
            fenced.steer(batch)
        return True

    def clear_worlds(self) -> None:
        """Delete what the workers of earlier worlds (restart mode) said to each other
        (their rank 0's address), fenced: a world about to start must meet its own rank
        0, never a stale one.

        Raises:
            LeadershipLost: another driver leads.
            RendezvousError: the store cannot be used.
        """
        self._fenced.steer([Delete(self._session.keys.worlds, prefix=True)])

    def publish_world(self, plan: Plan) -> None:
        """Make ``plan`` (a world of restart mode, its workers started) the job's round:
        one fenced write with the persisted state that goes with it (its restart
        counted). The agents prefix its workers' output with their ranks from it.

        Raises:
            LeadershipLost: another driver leads.
            RendezvousError: the store cannot be used.
        """
        plan = replace(plan, term=self._fenced.term())
        state = self._state_record()
        self._publish_plan(
            plan, [Put(self._session.keys.driver_state, state.to_json())], unless_finished=False
        )
        self._state_written = state
        self._state.plan = plan
        self._state.book = self._state.book.new_round(plan.round_id, plan.handover)
        self._held.processes.assign_ranks(plan)

    def publish_snapshot_round(self, plan: Plan) -> bool:
        """Publish a round that asks its members for a snapshot (``Plan.snapshot``: the
        final one of a stop, ``driver.job.stopping``, or the one before a preempted host
        goes, ``driver.policy.preemption``), fenced like any round, counted as no reset;
        False when the training finished first (no round is published after that)."""
        # A fresh token names this snapshot's files and parts: never those of an earlier
        # run of the job id whose rounds had the same numbers.
        # (The same members: no handover, whatever the round before was.)
        plan = replace(
            plan,
            term=self._fenced.term(),
            snapshot_token=secrets.token_hex(6),
            handover=False,
        )
        if not self._publish_plan(plan, [], unless_finished=True):
            return False
        self._state.plan = plan
        self._held.processes.assign_ranks(plan)
        return True

    def persist(self) -> tuple[dec.Wait, ...]:
        """Write the persisted state when it changed, at most every
        ``STATE_WRITE_INTERVAL`` (fenced: ``LeadershipLost`` if another driver leads).
        Returns the wait for the next write when this one is not due yet (else none)."""
        record = self._state_record()
        if not persisted.state_changed(self._state_written, record):
            return ()
        now = self._clock()
        if now < self._state_due:
            return (dec.Wait(self._state_due, "the next write of the driver state"),)
        try:
            self._fenced.steer([Put(self._session.keys.driver_state, record.to_json())])
        except RendezvousError as exc:
            log.warning("could not write the driver's state: %s", exc)
            return ()
        self._state_written, self._state_due = record, now + STATE_WRITE_INTERVAL
        return ()

    def _give_up_again(self, rec: WorkerRecord) -> None:
        """Stop (or kill) an adopted worker the predecessor had given up on."""
        worker_id = rec.worker_id
        stop = rec.state is lifecycle.WorkerState.STOPPING
        if worker_id in self._held:
            (self._held.stop if stop else self._held.kill)(worker_id)

    def _state_record(self) -> DriverStateRecord:
        now, state = self._clock(), self._state
        cooldowns = [persisted.Cooldown(h, n, u) for h, n, u in self._hosts.cooldowns()]
        return persisted.state_record(
            self._fenced.term(),
            state.book,
            cooldowns,
            self._held.processes.launched,
            state.workers,
            secret_fingerprint(self._session.secret),
            now=now,
            wall_now=time.time(),
        )
