"""The job's rules, as pure functions that return decisions, and the values they speak:
the decisions and the ``Book`` (``decisions``), the worker records (``lifecycle``) and
the round planner (``planner``).

Each function looks at the worker records (``driver.policy.lifecycle``), the current plan, the
job's ``Book`` (what the loop remembers between decisions), a ``HostsView`` (the host
manager's answers), the config and ``now``, and returns what to do (``driver.policy.decisions``):
``Publish``, ``Wait``, ``Fail``, ``Kill``, ``Stop``, ``Launch``, ``LaunchSpare``,
``Leave``, ``Promote``, ``Report`` (an event to emit), ``CountFailure``, ``Probe``,
``HostLost``, ``StartWorld``,
``Succeed``, or nothing. None of them
touches the store, a process or a clock; the main loop (``driver.job.loop``) carries the
decisions out. Functions that also update the book return a ``Step`` (the decisions and
the new book).

The rules, by concern (each module's docstring lists its own, with its constants):

* ``rounds``: when to publish the next round, wait or give up: the first round, the
  finish grace, the join window, a broken round and ``--elastic-timeout``, the reset
  limit, a script that fails everywhere, rounds lost in a row; the loop's next wake-up;
* ``exits``: what a worker's exit means (finished, failed, stopped, cannot start), the
  failure streak, and the job's outcome;
* ``occupancy``: which workers occupy which slots: free slots, displaced and hung
  workers, the chaos's victims, removed hosts' agents, every host blacklisted;
* ``reports``: what the job says while it waits on something outside it (no host
  listed, the store down) and how training progresses;
* ``suspicion``: who is dead: failure reports and silent peers turned into host probes
  and kills;
* ``spares``: warm spares (``--spares``): promoting one into a free slot, keeping each
  host's pool, a spare's quiet exit;
* ``preemption``: a host the scheduler takes back: a handover when others go on, else a
  snapshot first, then its workers stop;
* ``departures``: workers that leave on purpose at their next commit (a drained host's),
  and the handover round that lets the others go on without rolling back;
* ``restarts``: restart mode (``--restart-workers``): whole worlds started and stopped
  together, in place of the round rules.

This file names every rule, so the loop (and a test) reads them as one vocabulary:
``policy.plan_round``, ``policy.outcome``, ``policy.FINISH_GRACE``.
"""

from driver.policy.departures import LEAVE_WAIT, leaving_due
from driver.policy.exits import (
    CANNOT_RUN_CODES,
    FAILURE_STREAK_MIN,
    count_failure,
    finish_code,
    launch_failed,
    outcome,
    worker_exited,
)
from driver.policy.occupancy import (
    REREGISTER_GRACE,
    agents_to_retire,
    chaos_candidates,
    chaos_floor,
    chaos_kill,
    hosts_rule,
    lapse_waits,
    slots_to_fill,
    workers_to_kill,
    workers_to_stop,
)
from driver.policy.preemption import DRAIN_WAIT, drains_due, host_preempted
from driver.policy.reports import (
    DISCOVERY_ERROR_EVERY,
    RATE_WINDOW_MIN,
    REPEAT_REPORT_EVERY,
    SILENT_AFTER,
    discovery_failed,
    discovery_succeeded,
    no_hosts,
    progress_rate,
    progress_report,
    progress_reported,
    store_health,
)
from driver.policy.restarts import (
    QUICK_FAILURE,
    QUICK_FAILURES,
    world_host_preempted,
    world_launch_failed,
    world_outcome,
    world_rule,
    world_spares,
)
from driver.policy.rounds import (
    FINISH_GRACE,
    FIRST_ROUND_GRACE,
    JOIN_BATCH_WINDOW,
    LOST_ROUNDS_LIMIT,
    MAX_SLEEP,
    MIN_SLEEP,
    WAITING_REPORT_AFTER,
    live_infos,
    next_wakeup,
    plan_round,
    rounds_lost,
    script_fails,
)
from driver.policy.spares import (
    SPARE_REFILL_DELAY,
    SPARE_RETRY_DELAY,
    fill_slots,
    promotion_event,
    spare_exited,
    spare_launch_failed,
    spare_promoted,
    spares_held_for_world,
    spares_to_launch,
    spares_to_stop,
)
from driver.policy.suspicion import (
    CONFIRM_WINDOW,
    accusations_due,
    failure_reported,
    probe_answered,
    silence_reported,
)

__all__ = [
    # rounds
    "plan_round",
    "script_fails",
    "rounds_lost",
    "live_infos",
    "next_wakeup",
    "FIRST_ROUND_GRACE",
    "WAITING_REPORT_AFTER",
    "FINISH_GRACE",
    "JOIN_BATCH_WINDOW",
    "LOST_ROUNDS_LIMIT",
    "MAX_SLEEP",
    "MIN_SLEEP",
    # exits
    "worker_exited",
    "launch_failed",
    "count_failure",
    "finish_code",
    "outcome",
    "FAILURE_STREAK_MIN",
    "CANNOT_RUN_CODES",
    # occupancy
    "slots_to_fill",
    "workers_to_stop",
    "workers_to_kill",
    "lapse_waits",
    "chaos_candidates",
    "chaos_floor",
    "chaos_kill",
    "hosts_rule",
    "agents_to_retire",
    "REREGISTER_GRACE",
    # reports
    "no_hosts",
    "discovery_failed",
    "discovery_succeeded",
    "store_health",
    "progress_report",
    "progress_reported",
    "progress_rate",
    "REPEAT_REPORT_EVERY",
    "DISCOVERY_ERROR_EVERY",
    "SILENT_AFTER",
    "RATE_WINDOW_MIN",
    # spares
    "fill_slots",
    "promotion_event",
    "spares_to_launch",
    "spares_to_stop",
    "spare_exited",
    "spare_launch_failed",
    "spare_promoted",
    "spares_held_for_world",
    "SPARE_RETRY_DELAY",
    "SPARE_REFILL_DELAY",
    # preemption
    "host_preempted",
    "drains_due",
    "leaving_due",
    "LEAVE_WAIT",
    "DRAIN_WAIT",
    # restarts
    "world_rule",
    "world_outcome",
    "world_host_preempted",
    "world_launch_failed",
    "world_spares",
    "QUICK_FAILURE",
    "QUICK_FAILURES",
    # suspicion
    "CONFIRM_WINDOW",
    "accusations_due",
    "failure_reported",
    "silence_reported",
    "probe_answered",
]
