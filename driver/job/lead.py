"""What the leading driver writes and takes over: the job's rounds, its persisted state
(``JobKeys.driver_state``, fenced by the leader's term), and a job taken over from a
predecessor's records (``driver.lead.persisted``).

``JobLead`` is given what it uses (the job's state, services and keys, the hosts, the
worker processes, the event sink, a clock, ``post``); the main loop (``driver.job.loop``)
calls it for a ``Publish`` decision, after each reconcile (``persist``) and once at
``open`` when the claim adopts the job (``adopt``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Callable

from driver import events as ev
from driver.errors import JobFailed
from driver.hosts.manager import HostManager
from driver.hosts.slots import hosts_in_use
from driver.job import messages as msg
from driver.job.processes import WorkerProcesses
from driver.job.services import JobServices
from driver.job.state import JobState
from driver.launch.process import WorkerProcess
from driver.lead import persisted
from driver.lead.adopted_pids import EXIT_UNKNOWN, AdoptedProcesses
from driver.lead.terms import describe_leader, secret_id
from driver.policy import decisions as dec
from driver.policy import lifecycle
from driver.policy.lifecycle import WorkerRecord
from rendezvous import env
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.netaddr import is_local_host
from rendezvous.plan import DriverStateRecord
from rendezvous.store import Delete, Put

log = logging.getLogger(__name__)

STATE_WRITE_INTERVAL = 0.5
"""Seconds between two writes of the driver's persisted state (``JobKeys.driver_state``)
when it keeps changing; a change is written at most this late."""


class JobLead:
    """The lead's writes and the takeover of a job. ``adopted`` holds the workers known
    from their registration alone (``driver.lead.adopted_pids``)."""

    def __init__(
        self,
        state: JobState,
        services: JobServices,
        keys: JobKeys,
        secret: str,
        *,
        job_id: str,
        hosts: HostManager,
        processes: WorkerProcesses,
        events: ev.EventSink,
        clock: Callable[[], float],
        all_local: bool,
        post: Callable[[msg.Message], None],
    ):
        self._state = state
        self._services = services
        self._keys = keys
        self._secret = secret
        self._job_id = job_id
        self._hosts = hosts
        self._processes = processes
        self._events = events
        self._clock = clock
        self._all_local = all_local
        self._post = post
        self.adopted = AdoptedProcesses(self._adopted_gone)
        self._state_written: DriverStateRecord | None = None
        self._state_due = 0.0  # the next write of the persisted state, not before

    def adopt(self, handed_over: dict[str, WorkerProcess]) -> None:
        """Take the job over from the store's records (``driver.lead.persisted``): its plan,
        its registered workers, the book and the blacklist. A worker's process is the
        handle its agent's records gave (``handed_over``, by worker id), else known
        from its registration alone (``driver.lead.adopted_pids``).

        Raises:
            JobFailed: this driver does not have the job's secret (it steps down first,
                leaving the job as it is for a driver that has).
        """
        state, claim, now = self._state, self._services.claim, self._clock()
        view = persisted.rebuild_view(
            self._services.snapshot, self._keys, now=now, wall_now=time.time()
        )
        if view.secret_id and view.secret_id != secret_id(self._secret):
            claim.step_down()
            raise JobFailed(
                f"cannot take over job {self._job_id!r}: this driver does not have the "
                "job's secret; start it with ELASTIC_JOB_SECRET set as it was for the job's "
                "first driver (the job was left as it is)"
            )
        state.plan, state.book = view.plan, view.book
        state.workers.clear()
        state.workers.update(view.workers)
        for c in view.cooldowns:
            self._hosts.restore(c.host, c.strikes, c.until)
        self._processes.continue_ids_after(view.launched)
        for worker_id, (host, pid) in view.pids.items():
            rec = state.workers[worker_id]
            if not rec.state.running:
                continue
            process = handed_over.get(worker_id)
            if process is not None:
                self._events.emit(ev.WorkerAdopted(worker_id, rec.host, rec.slot, process.pid))
                self._processes.adopt(worker_id, process)
                continue
            self._events.emit(ev.WorkerAdopted(worker_id, rec.host, rec.slot, pid))
            self.adopted.adopt(worker_id, pid, local=self._all_local or is_local_host(host))
        for worker_id, process in handed_over.items():
            # Launched by the predecessor, running, not registered yet: it joins later.
            if worker_id in state.workers or env.ENV_WORKER_ID not in process.spec.env:
                continue
            spec = process.spec
            state.workers[worker_id] = WorkerRecord.launched(worker_id, spec.host, spec.slot, now)
            self._events.emit(ev.WorkerAdopted(worker_id, spec.host, spec.slot, process.pid))
            self._processes.adopt(worker_id, process)
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

    def publish(self, decision: dec.Publish) -> None:
        """Publish a round (one fenced write) and make it the job's."""
        plan = replace(decision.plan, term=self._services.claim.record.term)
        # One fenced write: the plan, the state that goes with it (its reset counted),
        # and the reports about older rounds, which this one settles; only while no
        # worker has recorded that its training returned: a round formed after that would
        # hand newcomers a finished training (JobKeys.training_finished).
        state = self._state_record()
        published = self._services.steer_unless(
            self._keys.training_finished,
            [
                Put(self._keys.round, plan.to_json()),
                Put(self._keys.driver_state, state.to_json()),
                Delete(self._keys.failures, prefix=True),
            ],
        )
        if published is None:
            log.info("round %d not formed: the training has finished", plan.round_id)
            self._state.book = replace(self._state.book, training_done=True)
            return
        self._state_written = state
        self._state.plan = plan
        self._state.book = self._state.book.new_round()
        self._processes.assign_ranks(plan)
        members = list(plan.worker_ids)
        self._events.emit(ev.RoundFormed(plan.round_id, plan.size, decision.seconds, members))

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
            self._services.steer([Put(self._keys.driver_state, record.to_json())])
        except RendezvousError as exc:
            log.warning("could not write the driver's state: %s", exc)
            return ()
        self._state_written, self._state_due = record, now + STATE_WRITE_INTERVAL
        return ()

    def _give_up_again(self, rec: WorkerRecord) -> None:
        """Stop (or kill) an adopted worker the predecessor had given up on."""
        worker_id = rec.worker_id
        stop = rec.state is lifecycle.WorkerState.STOPPING
        if worker_id in self._processes:
            (self._processes.stop if stop else self._processes.kill)(worker_id)
        elif worker_id in self.adopted:
            (self.adopted.stop if stop else self.adopted.kill)(worker_id)

    def _adopted_gone(self, worker_id: str) -> None:
        """An adopted worker is gone (a helper thread): its exit, code unknown, unless
        it said it finished its training (then 0)."""
        finished = self._services.has_key(self._keys.finished(worker_id))
        self._post(msg.ProcessExited(worker_id, 0 if finished else EXIT_UNKNOWN))

    def _state_record(self) -> DriverStateRecord:
        now, state = self._clock(), self._state
        cooldowns = [persisted.Cooldown(h, n, u) for h, n, u in self._hosts.cooldowns()]
        return persisted.state_record(
            self._services.claim.record.term,
            state.book,
            cooldowns,
            self._processes.launched,
            state.workers,
            secret_id(self._secret),
            now=now,
            wall_now=time.time(),
        )
