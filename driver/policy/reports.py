"""What the job says while it waits on something outside it, and how training goes (pure).

These rules decide only what to report and when to say it again; nothing here ends
the job (the timeouts that do are the round rules', ``driver.policy.rounds``, whose
reasons name an empty host list).

The rules:

* No hosts (``no_hosts``): while discovery lists no host, say so at once and every
  ``REPEAT_REPORT_EVERY`` seconds, and, once the job has hosts, that it keeps them
  meanwhile (``driver.hosts.manager``: an empty result mid-run removes nothing).
* The store (``store_health``, applied by the probe's own thread: the loop may be
  the one waiting for the store): a store that stops answering is said at once and
  every ``REPEAT_REPORT_EVERY`` seconds, and its return.
* Progress (``progress_report``): every ``--progress-interval``, the round, its size,
  rank 0's committed step and the steps per second.
"""

from __future__ import annotations

from dataclasses import replace

from driver.config import JobConfig
from driver.events import Event, HostDiscoveryFailed, Progress, StoreBack, StoreUnreachable, Waiting
from driver.events.base import plural
from driver.policy.decisions import Book, Decision, HostsView, Report, Step, StoreHealth, Wait
from rendezvous.plan import Plan

#: how often a wait that may be a mistake is said again (discovery lists no host)
REPEAT_REPORT_EVERY = 5.0
#: progress intervals without a new step from rank 0 after which training has stalled
STALLED_AFTER = 2.5


def no_hosts(book: Book, hosts: HostsView, config: JobConfig, now: float) -> Step:
    """Discovery lists no host at all: say so at once and every ``REPEAT_REPORT_EVERY``
    seconds while it lasts (an empty list is more often a broken script than a wait for
    machines, and either way the user should know what the job waits for). A job that
    has hosts keeps them meanwhile, and says that too."""
    if not hosts.none_listed:
        if book.no_hosts_since is None:
            return Step((), book)
        return Step((), replace(book, no_hosts_since=None, no_hosts_said_at=None))
    since = book.no_hosts_since if book.no_hosts_since is not None else now
    said = book.no_hosts_said_at
    decisions: list[Decision] = []
    if said is None or now - said >= REPEAT_REPORT_EVERY:
        what = _none_listed(config)
        if hosts.usable:
            what += f" (the job keeps its {plural(len(hosts.usable), 'host')} meanwhile)"
        decisions.append(Report(Waiting(what=what, waited=round(now - since, 3))))
        said = now
    decisions.append(Wait(said + REPEAT_REPORT_EVERY, "the next word on the empty host list"))
    return Step(tuple(decisions), replace(book, no_hosts_since=since, no_hosts_said_at=said))


def _none_listed(config: JobConfig) -> str:
    """What the job waits for while its source of hosts lists none, in its words."""
    if config.join is not None:
        if config.hosts or config.discovery_script:
            return "a host: no node has joined, and -H or the discovery script lists none"
        return "a node to join the job (none has yet)"
    if config.allocation:
        return "a host: the Slurm allocation has no usable node"
    if config.ray is not None:
        return "a host: the Ray cluster has no alive node"
    return f"a host: {'the discovery script' if config.discovery_script else 'the host list'} lists none"


DISCOVERY_ERROR_EVERY = 30.0
"""Seconds between two reports of the same discovery error (a script that keeps failing
every --discovery-interval would otherwise fill the output)."""


def discovery_failed(book: Book, error: str, now: float) -> Step:
    """A discovery run after the first failed with ``error``: say it at once when it is
    news (another error, or the first since a run succeeded), else at most every
    ``DISCOVERY_ERROR_EVERY`` seconds, with the count of failed runs not said."""
    if book.discovery_error is not None:
        said, said_at, unsaid = book.discovery_error
        if said == error and now - said_at < DISCOVERY_ERROR_EVERY:
            return Step((), replace(book, discovery_error=(said, said_at, unsaid + 1)))
        again = unsaid if said == error else 0
    else:
        again = 0
    return Step(
        (Report(HostDiscoveryFailed(error, again=again)),),
        replace(book, discovery_error=(error, now, 0)),
    )


def discovery_succeeded(book: Book) -> Book:
    """A discovery run succeeded: the next failure is news again."""
    return book if book.discovery_error is None else replace(book, discovery_error=None)


def store_health(
    health: StoreHealth, answered: bool, error: str, now: float
) -> tuple[StoreHealth, list[Event]]:
    """One look at the store (``answered``, else ``error``) and what to say of it: a
    store that stops answering at once, again every ``REPEAT_REPORT_EVERY`` seconds
    while it does not, and its return with how long it was away."""
    if answered:
        if health.down_since is None:
            return health, []
        return StoreHealth(), [StoreBack(seconds=round(now - health.down_since, 3))]
    if health.down_since is None:
        return StoreHealth(now, now, error), [StoreUnreachable(seconds=0.0, error=error)]
    if health.said_at is not None and now - health.said_at < REPEAT_REPORT_EVERY:
        return replace(health, error=error), []
    since = round(now - health.down_since, 3)
    return StoreHealth(health.down_since, now, error), [StoreUnreachable(since, error)]


def progress_report(book: Book, plan: Plan | None, config: JobConfig, now: float) -> Step:
    """Every ``--progress-interval`` once rank 0 has published a step: the round, its
    size, the step, and the steps per second between rank 0's last two publications;
    0.0 once none came for ``STALLED_AFTER`` intervals (rank 0 publishes only a step
    that moved: training stalls)."""
    interval, step, said_at = config.progress_interval, book.progress_step, book.progress_said_at
    if not interval or plan is None or step is None or book.progress_at is None:
        return Step((), book)
    if said_at is not None and now - said_at < interval:
        return Step((Wait(said_at + interval, "the next progress line"),), book)
    rate = book.progress_rate
    if now - book.progress_at > STALLED_AFTER * interval:
        rate = 0.0
    event = Progress(round=plan.round_id, size=plan.size, step=step, steps_per_second=rate)
    book = replace(book, progress_said_at=now)
    return Step((Report(event), Wait(now + interval, "the next progress line")), book)
