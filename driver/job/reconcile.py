"""The rules' turn of the driver's main loop (``driver.job.loop``): which rules of
``driver.policy`` run, in what order, each decision carried out before the next rule
reads the job (``rules_turn``), and whether the job has ended (``outcome``).

Why an order: the rules are pure functions of the workers' records, the round and the
book, and what one decides changes what the next reads: workers displaced stop before
free slots are filled, a round is planned from the workers that are left, and a new
spare's start comes last so as not to delay the round a promotion just formed. Under
``--restart-workers`` whole worlds are stopped and started instead of rounds
(``driver.policy.restarts``).
"""

from __future__ import annotations

import os

from driver.config import JobConfig
from driver.job.dispatch import Dispatch
from driver.job.host_actions import HostActions
from driver.job.state import JobState
from driver.launch.assignments.service import AgentService
from driver.policy import decisions as dec
from driver.policy import (
    departures,
    exits,
    occupancy,
    preemption,
    reports,
    restarts,
    rounds,
    spares,
    suspicion,
)
from driver.policy.reports import HostSource, ProgressSettings
from driver.policy.rounds import RoundSettings

#: rank 0's silence that kills it (the workers' ELASTIC_PEER_TIMEOUT: they inherit the
#: driver's environment)
_RANK0_SILENCE = suspicion.rank0_silence_after(os.environ)


def rules_turn(
    cfg: JobConfig,
    state: JobState,
    view: dec.HostsView,
    hosts: HostActions,
    agents: AgentService,
    dispatch: Dispatch,
    now: float,
    store_trouble_at: float | None = None,
) -> None:
    """Run the rules once over the job (``state``) and the hosts (``view``) at ``now``,
    carrying out each one's decisions (``dispatch``) before the next runs.
    ``store_trouble_at``: the latest moment the store did not answer the driver in time
    (None: never), on the clock of ``now``."""
    records = state.workers
    apply, step = dispatch.apply, dispatch.step
    settings, source = RoundSettings.from_config(cfg), HostSource.from_config(cfg)
    apply(occupancy.hosts_rule(records, state.plan, state.book, view, settings, now))
    if cfg.restart_workers:  # whole worlds instead of rounds (driver.policy.restarts)
        apply(hosts.agents_to_retire(view))
        step(reports.no_hosts(state.book, view, source, now))
        ready = agents.ready_hosts([h.host for h in view.usable])
        step(restarts.world_rule(records, state.plan, state.book, view, settings, now, ready))
        apply(spares.spares_to_stop(records, view.usable))
        apply(
            spares.spares_to_launch(records, state.plan, view.usable, state.book, cfg.spares, now)
        )
        return
    apply(occupancy.workers_to_stop(records, view.usable, state.plan, view.blacklisted, now))
    apply(spares.spares_to_stop(records, view.usable))
    apply(hosts.agents_to_retire(view))
    apply(occupancy.workers_to_kill(records, now))
    apply(occupancy.lapse_waits(records))
    apply(occupancy.slots_to_fill(records, view.usable, state.book, cfg.max_np))
    step(reports.no_hosts(state.book, view, source, now))
    progress = ProgressSettings.from_config(cfg)
    step(reports.progress_report(state.book, state.plan, progress, now))
    step(suspicion.accusations_due(records, state.book, now))
    quiet = suspicion.silent_rank0(
        records, state.plan, state.book, now, _RANK0_SILENCE, store_trouble_at
    )
    step(quiet)
    step(preemption.drains_due(records, state.book, now))
    snapshots = bool(cfg.checkpoint_dir)
    step(departures.leaving_due(records, state.book, now, state.plan, snapshots))
    step(rounds.plan_round(records, state.plan, state.book, view, settings, now))
    # Last: a new spare's start must not delay the round a promotion just formed.
    apply(spares.spares_to_launch(records, state.plan, view.usable, state.book, cfg.spares, now))


def outcome(cfg: JobConfig, state: JobState) -> dec.Succeed | dec.Fail | None:
    """Whether the job has ended: ``Succeed``, ``Fail`` or None (it goes on)."""
    rule = restarts.world_outcome if cfg.restart_workers else exits.outcome
    return rule(state.workers, state.plan, state.book)
