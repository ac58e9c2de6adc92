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
* Progress (``progress_reported``, ``progress_report``): rank 0 rewrites its step every
  ``progress_period`` (a second at most), changed or not; its first report is said at
  once (a job of a few seconds says one too), then one line every
  ``--progress-interval`` with the round, its size, the step and the steps per second
  over the last interval of wall time, measured between two reports the driver saw
  (so a stall, an outage, a burst of late reports all count at their true length).
  The rate is never negative: a step that goes back (the state lost, or resumed from
  an older snapshot) is said as such, and the rate starts over from there. A rank 0
  not heard for ``SILENT_AFTER`` periods is said to be quiet, with no rate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from driver.config import JobConfig
from driver.events import Event, HostDiscoveryFailed, Progress, StoreBack, StoreUnreachable, Waiting
from driver.events.base import format_seconds, plural
from driver.policy.decisions import Book, Decision, HostsView, Report, Step, StoreHealth, Wait
from driver.policy.memory.hosts import DiscoveryError
from driver.policy.memory.progress import ProgressBook, ProgressSample
from rendezvous.schema.rounds import Plan
from rendezvous.schema.workers import progress_period

#: how often a wait that may be a mistake is said again (discovery lists no host)
REPEAT_REPORT_EVERY = 5.0
#: rank 0's reports missed in a row (``progress_period`` each) after which it is quiet
SILENT_AFTER = 3
#: the least part of a progress interval its reports must span to give a rate
RATE_WINDOW_MIN = 0.5


@dataclass(frozen=True)
class HostSource:
    """Where the job's hosts come from, as the empty-list line names it (``no_hosts``):
    nodes that join (``--join``), ``-H``, a discovery script, the Slurm allocation, a
    Ray cluster."""

    joined: bool = False
    listed: bool = False
    script: bool = False
    allocation: bool = False
    ray: bool = False

    @classmethod
    def from_config(cls, config: JobConfig) -> HostSource:
        return cls(
            joined=config.join is not None,
            listed=bool(config.hosts),
            script=bool(config.discovery_script),
            allocation=config.allocation,
            ray=config.ray is not None,
        )


@dataclass(frozen=True)
class ProgressSettings:
    """What the progress rules read of the configuration: ``--progress-interval`` (0:
    no progress lines)."""

    interval: float

    @classmethod
    def from_config(cls, config: JobConfig) -> ProgressSettings:
        return cls(interval=config.progress_interval)


def no_hosts(book: Book, hosts: HostsView, source: HostSource, now: float) -> Step:
    """Discovery lists no host at all: say so at once and every ``REPEAT_REPORT_EVERY``
    seconds while it lasts (an empty list is more often a broken script than a wait for
    machines, and either way the user should know what the job waits for). A job that
    has hosts keeps them meanwhile, and says that too."""
    hb = book.hosts
    if not hosts.none_listed:
        if hb.no_hosts_since is None:
            return Step((), book)
        return Step(
            (), replace(book, hosts=replace(hb, no_hosts_since=None, no_hosts_said_at=None))
        )
    since = hb.no_hosts_since if hb.no_hosts_since is not None else now
    said = hb.no_hosts_said_at
    decisions: list[Decision] = []
    if said is None or now - said >= REPEAT_REPORT_EVERY:
        what = _none_listed(source)
        if hosts.usable:
            what += f" (the job keeps its {plural(len(hosts.usable), 'host')} meanwhile)"
        decisions.append(Report(Waiting(what=what, waited=round(now - since, 3))))
        said = now
    decisions.append(Wait(said + REPEAT_REPORT_EVERY, "the next word on the empty host list"))
    hb = replace(hb, no_hosts_since=since, no_hosts_said_at=said)
    return Step(tuple(decisions), replace(book, hosts=hb))


def _none_listed(source: HostSource) -> str:
    """What the job waits for while its source of hosts lists none, in its words."""
    if source.joined:
        if source.listed or source.script:
            return "a host: no node has joined, and -H or the discovery script lists none"
        return "a node to join the job (none has yet)"
    if source.allocation:
        return "a host: the Slurm allocation has no usable node"
    if source.ray:
        return "a host: the Ray cluster has no alive node"
    return f"a host: {'the discovery script' if source.script else 'the host list'} lists none"


DISCOVERY_ERROR_EVERY = 30.0
"""Seconds between two reports of the same discovery error (a script that keeps failing
every --discovery-interval would otherwise fill the output)."""


def discovery_failed(book: Book, error: str, now: float) -> Step:
    """A discovery run after the first failed with ``error``: say it at once when it is
    news (another error, or the first since a run succeeded), else at most every
    ``DISCOVERY_ERROR_EVERY`` seconds, with the count of failed runs not said."""
    last = book.hosts.discovery_error
    if last is not None:
        if last.error == error and now - last.said_at < DISCOVERY_ERROR_EVERY:
            unsaid = last._replace(unsaid=last.unsaid + 1)
            return Step((), replace(book, hosts=replace(book.hosts, discovery_error=unsaid)))
        again = last.unsaid if last.error == error else 0
    else:
        again = 0
    said = DiscoveryError(error, now, 0)
    return Step(
        (Report(HostDiscoveryFailed(error, again=again)),),
        replace(book, hosts=replace(book.hosts, discovery_error=said)),
    )


def discovery_succeeded(book: Book) -> Book:
    """A discovery run succeeded: the next failure is news again."""
    if book.hosts.discovery_error is None:
        return book
    return replace(book, hosts=replace(book.hosts, discovery_error=None))


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


def store_outage_over(health: StoreHealth, now: float, bound: float) -> str | None:
    """Why the job ends now, when the store has not answered for longer than ``bound``
    (``--elastic-timeout``) by ``now``; None while it answers or the outage is shorter.
    The ring trains without the store, but no worker lost meanwhile can be replaced,
    no snapshot agreed on and no plan changed: an outage without end would hold the
    job (and its hosts) for as long as it lasts."""
    if health.down_since is None or now - health.down_since <= bound:
        return None
    away = format_seconds(now - health.down_since)
    last = f" (last error: {health.error})" if health.error else ""
    return f"it has not answered for {away}, more than --elastic-timeout {bound:g}s{last}"


def progress_reported(
    book: Book,
    step: int,
    round_id: int,
    config: ProgressSettings,
    now: float,
    commit_round: int = 0,
    plan: Plan | None = None,
) -> Book:
    """Rank 0 of round ``round_id`` holds ``step`` commits, the newest made in round
    ``commit_round`` (0: not said), as the driver heard at ``now`` (its progress record,
    or the record of a worker whose training finished). When that is ``plan``'s round,
    its members are the commit's holders (``ProgressBook.commit_members``).
    A record of an older round than the newest heard is ignored: that rank 0 had not
    yet seen its round end. A step below the newest heard went back: the rate's window
    starts over at it, and the next line says so."""
    pb = book.progress
    if pb.step is not None and round_id < pb.round_id:
        return book
    seen, back_from = pb.seen, pb.back_from
    if pb.step is not None and step < pb.step:
        back_from = max(back_from or 0, pb.step)
        seen = ()
    seen = (*seen, ProgressSample(now, step))
    # From the newest report at least an interval old on: the rate's window, no more.
    start = max((i for i, s in enumerate(seen) if s.at <= now - config.interval), default=0)
    pb = replace(
        pb,
        step=step,
        round_id=round_id,
        at=now,
        seen=seen[start:],
        back_from=back_from,
        commit_members=(
            frozenset(plan.worker_ids)
            if plan is not None and commit_round == plan.round_id
            else pb.commit_members
        ),
    )
    return replace(book, progress=pb)


def progress_rate(book: ProgressBook, interval: float) -> float | None:
    """Steps per second between the oldest and the newest report of the window (the
    last ``interval`` of wall time as the driver heard it); None while they span less
    than ``RATE_WINDOW_MIN`` of it (the first reports, or right after the step went
    back), and after the step went back, until the next line."""
    seen = book.seen
    if book.back_from is not None or len(seen) < 2:
        return None
    (first_at, first), (last_at, last) = seen[0], seen[-1]
    if last_at - first_at < RATE_WINDOW_MIN * interval:
        return None
    return round((last - first) / (last_at - first_at), 3)


def progress_report(book: Book, plan: Plan | None, config: ProgressSettings, now: float) -> Step:
    """Once rank 0 has reported a step, a line at once and then every
    ``--progress-interval``: the round, its size, the step, the steps per second
    (``progress_rate``), the step it went back from since the last line, and how long
    rank 0 has been quiet when it has for ``SILENT_AFTER`` report periods."""
    pb = book.progress
    interval, step, said_at = config.interval, pb.step, pb.said_at
    if not interval or plan is None or step is None or pb.at is None:
        return Step((), book)
    if said_at is not None and now - said_at < interval:
        return Step((Wait(said_at + interval, "the next progress line"),), book)
    quiet = now - pb.at
    heard = quiet <= SILENT_AFTER * progress_period(interval)
    event = Progress(
        round=plan.round_id,
        size=plan.size,
        step=step,
        steps_per_second=progress_rate(pb, interval) if heard else None,
        back_from=pb.back_from,
        quiet_for=None if heard else round(quiet, 3),
    )
    book = replace(book, progress=replace(pb, said_at=now, back_from=None))
    return Step((Report(event), Wait(now + interval, "the next progress line")), book)
