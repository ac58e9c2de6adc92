"""Which worker processes run, and where: slots to fill, workers to stop or kill, the
wait for blacklisted hosts (pure).

Each rule returns the ``Launch``, ``Stop``, ``Kill`` and ``Wait`` decisions that bring
the running workers in line with the usable hosts (``HostsView``); the round rules
(``driver.policy.rounds``) then decide on the round those workers form.

The rules:

* Free slots (``slots_to_fill``): a launch for each free slot of a usable host (running
  workers and finished slots occupy theirs, spares none), up to ``--max-np``; a
  registered spare of the slot's host takes it instead (``driver.policy.spares``).
* Displaced workers (``workers_to_stop``): an active worker whose host or slot left the
  job is stopped, and the stop is said (a member of the round whose host discovery
  dropped leaves at its next commit instead: ``driver.policy.departures``) (a spare's slot is no member slot: spares follow
  their own rule, ``spares.spares_to_stop``).
* Reregister grace (``workers_to_kill``, ``lapse_waits``): a worker whose registration
  lapsed and that has not registered again within ``REREGISTER_GRACE`` is killed (it
  is hung).
* Chaos (``chaos_candidates``, ``chaos_kill``): ``--chaos-kill-interval`` picks among
  the active members of the round, none once a worker finished and none that would take
  the round below ``--min-np`` (unless ``--chaos-below-min-np``); the kill is said.
* Removed hosts' agents (``agents_to_retire``): the agent of a host discovery removed
  (not one blacklisted or lost: those may come back) is retired once nothing the job
  assigned there runs, so a machine that left the job is free of it.
* All hosts blacklisted (``hosts_rule``): with nothing running, wait for the first
  cooldown to end, unless that is later than the job may wait anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from driver.events import ChaosKill, WorkerStopping
from driver.flags import HANDOFF_WAIT
from driver.hosts.slots import HostSlots
from driver.policy import planner
from driver.policy.decisions import (
    Book,
    Decision,
    Fail,
    HostsView,
    Kill,
    Launch,
    Promote,
    Report,
    RetireAgent,
    Stop,
    Wait,
)
from driver.policy.departures import LEAVE_WAIT, leave_at_commit
from driver.policy.lifecycle import WorkerRecord, Workers, WorkerState
from driver.policy.rounds import RoundSettings
from driver.policy.spares import fill_slots
from rendezvous.schema.rounds import Plan

#: a worker whose registration vanished (lease expired) but whose process runs is killed
#: if it has not registered again after this long: it is hung, and its slot is refilled
REREGISTER_GRACE = 10.0


def slots_to_fill(
    workers: Workers, usable: Sequence[HostSlots], book: Book, max_np: int | None
) -> list[Launch | Promote]:
    """A launch, or a spare's promotion, for each free slot (running workers and
    finished slots occupy theirs, spares none), up to ``max_np`` workers; none once
    training is done (a newcomer would start it over)."""
    if book.training_done:
        return []
    occupied = [(r.host, r.slot) for r in workers.values() if r.state.running and not r.spare]
    free = planner.free_slots(usable, occupied + sorted(book.rounds.done_slots), max_np)
    return fill_slots(free, workers)


def workers_to_stop(
    workers: Workers,
    usable: Sequence[HostSlots],
    plan: Plan | None = None,
    blacklisted: Sequence[str] = (),
    now: float = 0.0,
) -> list[Decision]:
    """Stop the active workers (not spares) whose host or slot left the job (and say so).
    A registered member of ``plan`` whose host was not blacklisted (discovery dropped it,
    or its slot) leaves at its next commit instead, while other members go on
    (``driver.policy.departures``); when every running member's host left (a world
    replaced whole), they stay until newcomers hold the state, up to ``HANDOFF_WAIT``,
    blacklisted or not: stopped, they would take the only copy of the state along."""
    active = [r for r in workers.values() if r.state.active and not r.spare]
    reason = "its host or slot left the job"
    displaced = planner.displaced_workers(active, usable)
    gone = {r.worker_id for r in displaced}
    members = plan.worker_ids if plan is not None else ()
    stays = any(w not in gone and w in workers and workers[w].state.running for w in members)
    decisions: list[Decision] = []
    for r in displaced:
        event = WorkerStopping(worker=r.worker_id, host=r.host, slot=r.slot, reason=reason)
        # (A blacklisted host's members are stopped, as what may be broken, unless they
        # hold the only copy of the state: then they too wait for newcomers to hold it.)
        if r.live and r.worker_id in members and (r.host not in blacklisted or not stays):
            wait = LEAVE_WAIT if stays else HANDOFF_WAIT
            decisions += [Report(event), *leave_at_commit([r.worker_id], reason, now, wait)]
        else:
            decisions += [Report(event), Stop(r.worker_id, reason)]
    return decisions


def workers_to_kill(workers: Workers, now: float) -> list[Kill]:
    """Workers whose registration lapsed more than ``REREGISTER_GRACE`` ago."""
    return [
        Kill(
            r.worker_id,
            f"its registration lapsed and it did not register again within {REREGISTER_GRACE:g}s",
        )
        for r in workers.values()
        if r.state is WorkerState.UNREGISTERED and now - r.since > REREGISTER_GRACE
    ]


def lapse_waits(workers: Workers) -> list[Wait]:
    """When each lapsed registration's grace ends."""
    return [
        Wait(r.since + REREGISTER_GRACE, f"{r.worker_id} to register again")
        for r in workers.values()
        if r.state is WorkerState.UNREGISTERED
    ]


def chaos_floor(min_np: int, np: int) -> int:
    """The fewest active members a chaos kill may leave in any round: ``--min-np``, the
    world the user declared survivable; in a fixed-size job (``min_np`` is ``np``), one
    short of it (the replacement's wait, which is what such a job survives); never 0."""
    return max(1, min_np if min_np < np else np - 1)


def chaos_candidates(
    workers: Workers,
    plan: Plan | None,
    book: Book,
    min_np: int,
    np: int,
    below_min_np: bool = False,
) -> list[str]:
    """Members of the round the chaos may kill: none once a worker finished or the
    training is done (the end of training is not the time to test recovery, and its
    commit is the job's result), and none when the kill would leave fewer active
    members than ``chaos_floor`` (``below_min_np``: ``--chaos-below-min-np`` lifts this,
    the last member included). A shrunk round counts against ``--min-np``, not its size."""
    if plan is None or book.rounds.done_slots or book.training_done:
        return []
    active = [m.worker_id for m in plan.members if workers[m.worker_id].state.active]
    floor = 0 if below_min_np else chaos_floor(min_np, np)
    if len(active) - 1 < floor:
        return []
    return active


def chaos_kill(rec: WorkerRecord, plan: Plan | None, pid: int, kills: int) -> list[Decision]:
    """The chaos chose ``rec`` (process ``pid``, its ``kills``-th victim): say so, kill it."""
    member = plan.member(rec.worker_id) if plan is not None else None
    event = ChaosKill(
        worker=rec.worker_id,
        host=rec.host,
        slot=rec.slot,
        rank=member.rank if member is not None else None,
        pid=pid,
        kill=kills,
    )
    return [Report(event), Kill(rec.worker_id, "chaos", chaos=True)]


def agents_to_retire(
    agent_hosts: Iterable[str], busy_hosts: Iterable[str], workers: Workers, hosts: HostsView
) -> list[RetireAgent]:
    """A retirement for each live agent (``agent_hosts``) whose host discovery no longer
    lists, that is not blacklisted (a cooldown ends: it may come back) and where nothing
    the job assigned still runs: no running worker record (a stopped worker's exit was
    reported) and no process its agent still runs (``busy_hosts``: ps shards too)."""
    kept = set(hosts.listed) | {h.host for h in hosts.usable} | set(hosts.blacklisted)
    busy = set(busy_hosts) | {r.host for r in workers.values() if r.state.running}
    return [RetireAgent(h) for h in sorted(set(agent_hosts)) if h not in kept and h not in busy]


def hosts_rule(
    workers: Workers,
    plan: Plan | None,
    book: Book,
    hosts: HostsView,
    config: RoundSettings,
    now: float,
) -> list[Decision]:
    """A wait for the next cooldown to end; and when every host is blacklisted and no
    worker runs, a failure if that end is later than the job may wait."""
    release = hosts.next_release
    if hosts.all_blacklisted and not any(r.state.running for r in workers.values()):
        if plan is None:
            limit, flag = book.rounds.started_at + config.start_timeout, "--start-timeout"
        else:
            since = book.rounds.broken_since if book.rounds.broken_since is not None else now
            limit = since + config.elastic_timeout
            flag = "--elastic-timeout"
        if release is None or release > limit:
            return [
                Fail(
                    "every host is blacklisted after repeated worker failures ("
                    + ", ".join(hosts.blacklisted)
                    + f") and none comes back within {flag}"
                )
            ]
    return [Wait(release, "a blacklisted host to come back")] if release is not None else []
