"""The job's rules, as pure functions that return decisions, and the values they speak.

Each rule looks at the worker records (``driver.policy.lifecycle``), the current plan,
the job's ``Book`` (what the loop remembers between decisions, one record per concern:
``driver.policy.memory``), a ``HostsView`` (the host manager's answers), the slice of
the configuration it reads (``rounds.RoundSettings``, ``reports.ProgressSettings``,
``reports.HostSource``) and ``now``, and returns what to do (``driver.policy.decisions``):
``Publish``, ``Wait``, ``Fail``, ``Kill``, ``Stop``, ``Launch``, ``LaunchSpare``,
``Leave``, ``Promote``, ``Report`` (an event to emit), ``CountFailure``, ``Probe``,
``HostLost``, ``StartWorld``, ``Succeed``, or nothing. None of them touches the store,
a process or a clock; the main loop (``driver.job.loop``) carries the decisions out.
Functions that also update the book return a ``Step`` (the decisions and the new book).

The rules, by concern (each module's docstring lists its own, with its constants); a
caller imports the rule from its module (``rounds.plan_round``), there is no index:

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
"""
