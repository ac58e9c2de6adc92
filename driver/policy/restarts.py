"""Restart mode (``elastic-run --restart-workers``): whole worlds of workers, started
together and restarted together, as torchrun does (pure).

A script written for torchrun joins no round: it reads its ranks from its environment
once (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...) and forms its own process group.
So the driver starts a *world*: a worker in every slot of the usable hosts (up to
``--max-np``), ranked in placement order (``planner.lay_out_world``), and keeps it as
the job's plan (round ``World.number``). When its membership changes, every worker of
it stops and a new world starts over the hosts usable then; the script's own
checkpoints carry the training across. The change is seen as soon as the driver sees
it (a process exit, an agent's lapsed lease), not at a collective's timeout.

The rules (``world_rule``, asked after every message instead of the round rules):

* First world: once the usable hosts hold ``-np`` slots; ``--start-timeout`` ends the
  job before that.
* A world ends (``WorldStopping``; each of its workers still running is stopped:
  SIGTERM, SIGKILL after the grace) when (``world_end``):

  - a worker of it exits with anything but 0, or the driver killed it (its host was
    lost, the chaos): a failure; the next world is a restart
    (``TORCHELASTIC_RESTART_COUNT`` + 1, counted against ``--reset-limit``);
  - a worker was stopped (its host preempted) or its slot left the job (discovery
    removed its host or slot): not a failure;
  - the usable slots would make a bigger world (discovery added a host, a blacklisted
    host came back), as long as no worker of it has finished: not a failure. Only a
    host *ready* to take processes counts: one whose processes go through an agent
    once its agent is live. Until then the world goes on and the host's agent is
    started beside it (``PrepareHost``): a host still listed but dead (a node cut off
    whose cooldown ended while the cluster still lists it) would otherwise stop a
    healthy world for a launch that fails, again after every cooldown. An agent that
    cannot start makes its host lost (its cooldown again), the world untouched.

* Between worlds (``_next_world``): the next world starts once no worker of the job
  runs (a world never overlaps the one before: its ports, devices and files are free),
  on the slots usable then, when there are at least ``--min-np``; below that the job
  waits (``rounds.waiting_for``), up to ``--elastic-timeout``.
* Limits: a restart beyond ``--reset-limit`` ends the job; so do ``QUICK_FAILURES``
  worlds in a row that ended by the script's own error (``_failed_as_it_started``: a
  worker exited with an error code within ``QUICK_FAILURE`` of the world's start, and
  no worker of it was killed, by a signal or by the driver): the script fails as it
  starts, and another restart would only repeat it. A kill says nothing of the script
  (an operator, the OOM killer, a lost host), and its peers' errors follow from it.
* Success (``world_outcome``): every worker of the world exited 0. One that exits 0
  while others still run waits for them (they are finishing too).
* Workers of no world (``_strays``: a predecessor's, taken over with the job) are
  stopped: a world starts only with workers that were told its ranks.
* A preempted host (``world_host_preempted``) leaves the job for its cooldown, its
  workers stopped at once: there is no snapshot of ours to wait for (the script keeps
  its own checkpoints).
* Warm spares (``--spares N``; ``driver.programs.world_spare``): each usable host keeps
  ``N`` processes that have imported what the program imports and wait for a seat
  (the pool's rules are ``driver.policy.spares``'). A world's seat goes to a
  registered spare of its host (``world_spares``; the longest registered first), else
  to a fresh process. A spare is in no world until it takes a seat: it is no stray,
  and the next world does not wait for it to exit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from driver.events import HostPreempted, WorldStopping, describe_code
from driver.policy import planner, rounds
from driver.policy.decisions import (
    Book,
    Decision,
    Fail,
    HostLost,
    HostsView,
    PrepareHost,
    Promote,
    Report,
    StartWorld,
    Step,
    Stop,
    Succeed,
    Wait,
)
from driver.policy.lifecycle import WorkerRecord, Workers, WorkerState
from driver.policy.memory.worlds import WorldBook, WorldEnd
from driver.policy.planner import WorkerSlot, World
from driver.policy.rounds import RoundSettings
from driver.policy.spares import fill_slots
from rendezvous.schema.rounds import Member, Plan

#: seconds after a world's start within which a worker's error exit counts as the script
#: failing as it starts (its imports, its arguments, its first step)
QUICK_FAILURE = 60.0
#: worlds in a row ended that way that end the job
QUICK_FAILURES = 3

_FAILED = (WorkerState.FAILED, WorkerState.KILLED, WorkerState.CHAOS_KILLED)


def world_rule(
    workers: Workers,
    plan: Plan | None,
    book: Book,
    hosts: HostsView,
    config: RoundSettings,
    now: float,
    ready: frozenset[str] | None = None,
) -> Step:
    """What to do about the current world (``plan``), or the next one (see the module
    docstring): stop the workers of a world that ends, start the next once every
    worker of the job is gone, wait, or give up. ``ready``: the usable hosts that can
    take a process now (None: all of them)."""
    members = plan.worker_ids if plan is not None else ()
    decisions: list[Decision] = list(_strays(workers, members))
    if plan is not None and book.world.end is None:
        ready = ready if ready is not None else frozenset(h.host for h in hosts.usable)
        decisions += [PrepareHost(h.host) for h in hosts.usable if h.host not in ready]
        end = world_end(workers, plan, hosts, config.max_np, ready)
        if end is not None:
            quick = (
                book.world.quick_failures + 1 if _failed_as_it_started(workers, plan, now) else 0
            )
            book = replace(book, world=WorldBook(end, quick))
            decisions.append(Report(WorldStopping(plan.round_id, end.reason, end.failure)))
    if plan is not None and book.world.end is not None:
        why = f"world {plan.round_id} stops: {book.world.end.reason}"
        decisions += [Stop(w, why) for w in members if workers[w].state.active]
    if any(r.state.running and not r.spare for r in workers.values()):
        return Step(tuple(decisions), book)  # their exits are messages: the loop wakes
    if plan is not None and book.world.end is None:
        return Step(tuple(decisions), book)  # every worker exited 0: ``world_outcome``
    step = _next_world(plan, book, hosts, config, now)
    return Step((*decisions, *step.decisions), step.book)


def world_end(
    workers: Workers,
    plan: Plan,
    hosts: HostsView,
    max_np: int | None,
    ready: frozenset[str] | None = None,
) -> WorldEnd | None:
    """Why the world of ``plan`` must end now, None while it may go on (see the module
    docstring); a failure comes first, so that it is counted. The world grows only
    onto usable hosts that are ``ready`` (None: all of them), up to ``max_np``."""
    members = [(m, workers[m.worker_id]) for m in plan.members]
    for m, r in members:
        if r.state in _FAILED:
            return WorldEnd(_failure(m, r), failure=True)
    for m, r in members:
        if r.state in (WorkerState.STOPPING, WorkerState.STOPPED):
            return WorldEnd(f"{_label(m)} was stopped", failure=False)
    allowed = set(planner.allowed_slots(hosts.usable))
    for m, r in members:
        if r.state.running and (m.host, m.slot) not in allowed:
            return WorldEnd(f"the slot of {_label(m)} left the job", failure=False)
    if not any(r.state is WorkerState.FINISHED for _, r in members):
        growable = [h for h in hosts.usable if ready is None or h.host in ready]
        usable = len(planner.world_slots(growable, max_np))
        if usable > plan.size:
            return WorldEnd(
                f"{usable} slots are usable: the world grows from {plan.size}", failure=False
            )
    return None


def world_outcome(workers: Workers, plan: Plan | None, book: Book) -> Succeed | None:
    """``Succeed`` once every worker of the world exited 0 (and the world is not
    ending for another reason); None while the job goes on."""
    if plan is None or book.world.end is not None:
        return None
    if all(workers[w].state is WorkerState.FINISHED for w in plan.worker_ids):
        return Succeed(plan.round_id, plan.size, book.rounds.resets)
    return None


def world_host_preempted(workers: Workers, host: str) -> list[Decision]:
    """The agent of ``host`` got SIGTERM (the scheduler takes the host back): the host
    leaves the job for its cooldown and its workers stop now; the world they were in
    ends with them (not a failure)."""
    here = sorted(r.worker_id for r in workers.values() if r.host == host and r.state.running)
    stops = [Stop(w, f"its host {host} was preempted") for w in here if workers[w].state.active]
    return [Report(HostPreempted(host, here, snapshot=False)), HostLost(host, "preempted"), *stops]


def world_spares(world: World, workers: Workers) -> dict[int, str]:
    """The registered spares that take seats of ``world``, by rank: on each host, its
    seats in rank order to its spares longest registered first, as long as it has
    any (see the module docstring)."""
    slots = [WorkerSlot(seat.host, seat.slot) for seat in world.seats]
    return {
        seat.rank: d.worker_id
        for seat, d in zip(world.seats, fill_slots(slots, workers))
        if isinstance(d, Promote)
    }


def world_launch_failed(book: Book, reason: str) -> Book:
    """A worker of the world just started could not be started (``reason``): the world
    ends, as a failure (the rest of it is stopped at the next turn of the rules)."""
    if book.world.end is not None:
        return book
    end = WorldEnd(f"a worker could not start: {reason}", failure=True)
    return replace(book, world=replace(book.world, end=end))


def _next_world(
    plan: Plan | None, book: Book, hosts: HostsView, config: RoundSettings, now: float
) -> Step:
    """No worker of the job runs, and the world before (if any) has ended: start the
    next one when the usable slots allow it, else wait (or give up)."""
    slots = planner.world_slots(hosts.usable, config.max_np)
    if plan is None:
        if len(slots) < config.np:
            return _first_wait(len(slots), book, config, now)
    elif len(slots) < config.min_np:
        what = (
            f"world {plan.round_id} ended; waiting for {config.min_np} slots to start "
            f"the next (have {len(slots)})"
        )
        return rounds.waiting_for(
            what, "world", len(slots), config.min_np, book, hosts, config, now
        )
    end = book.world.end
    failure = end is not None and end.failure
    restarts = book.rounds.resets + int(failure)
    limit = config.reset_limit
    if end is not None and failure and limit is not None and restarts > limit:
        return Step(
            (
                Fail(
                    f"restart limit exceeded: world {plan.round_id if plan else 0} failed "
                    f"({end.reason}) after {book.rounds.resets} restart(s) (--reset-limit {limit})"
                ),
            ),
            book,
        )
    if end is not None and book.world.quick_failures >= QUICK_FAILURES:
        return Step(
            (
                Fail(
                    f"the script exited with an error within {QUICK_FAILURE:g}s of its start "
                    f"in {QUICK_FAILURES} worlds in a row (last: {end.reason}): it fails as "
                    "it starts, and a restart would only repeat it; see the worker output "
                    "above"
                ),
            ),
            book,
        )
    change_at = book.rounds.change_at
    took = 0.0 if plan is None or change_at is None else now - change_at
    world = planner.lay_out_world(plan.round_id + 1 if plan else 1, restarts, slots)
    started_over = replace(
        book.rounds,
        resets=restarts,
        broken_since=None,
        waiting_reported=False,
        change_at=None,
        done_slots=frozenset(),
        member_finished_at=None,
    )
    book = replace(
        book,
        rounds=started_over,
        world=replace(book.world, end=None),
        failures=replace(book.failures, streak=0),
    )
    return Step((StartWorld(world, round(took, 3)),), book)


def _first_wait(usable: int, book: Book, config: RoundSettings, now: float) -> Step:
    """The first world waits for ``-np`` slots, up to ``--start-timeout``."""
    started_at, no_hosts_since = book.rounds.started_at, book.hosts.no_hosts_since
    if now - started_at <= config.start_timeout:
        return Step((Wait(started_at + config.start_timeout, "-np slots"),), book)
    listed = (
        f"discovery has listed no host for {now - no_hosts_since:.0f}s"
        if no_hosts_since is not None and usable == 0
        else f"only {usable} usable slot(s) for -np {config.np}"
    )
    return Step(
        (Fail(f"{listed}: no world could start within --start-timeout {config.start_timeout:g}s"),),
        book,
    )


def _strays(workers: Workers, members: Sequence[str]) -> list[Stop]:
    """Stop the active workers of no world: no rank was given to them in this term."""
    return [
        Stop(r.worker_id, "it is in no world of this driver's")
        for r in workers.values()
        if r.state.active and not r.spare and r.worker_id not in members
    ]


def _failed_as_it_started(workers: Workers, plan: Plan, now: float) -> bool:
    """A worker of the world exited with an error code within ``QUICK_FAILURE`` of the
    world's start, and none of it was killed (see the module docstring)."""
    records = [workers[w] for w in plan.worker_ids]
    started = min((r.launched_at for r in records), default=now)
    failed = [r for r in records if r.state in _FAILED]
    errors = [r for r in failed if r.died_on_its_own and (r.exit_code or 0) > 0]
    return now - started < QUICK_FAILURE and bool(errors) and len(errors) == len(failed)


def _label(member: Member) -> str:
    return f"worker [{member.rank}] {member.host}:{member.slot}"


def _failure(member: Member, rec: WorkerRecord) -> str:
    """How a worker of the world failed, in a few words."""
    if rec.state is WorkerState.CHAOS_KILLED or rec.kill_reason == "chaos":
        return f"{_label(member)} was killed by the chaos"
    if rec.kill_reason is not None:
        return f"{_label(member)} was killed by the driver: {rec.kill_reason}"
    return f"{_label(member)} {describe_code(rec.exit_code)}"
