"""The ps supervisor's rules (pure): what it knows of the shards (``PSView``), and for
each message of its queue (``driver.ps.messages``) the view after it and the actions to
carry out (``decide``). ``driver.ps.supervisor`` does the I/O: it starts processes,
reads and writes the store, emits the events.

* A shard is ready once its ``ShardInfo`` says it serves *and* carries the pid of the
  process the supervisor runs as the shard (a dead shard's record is never taken for its
  replacement's): ``ps_started``, once per process. With ``--ps-replicas 1`` it also
  needs its backup in step: the shard's ``ReplicaRecord`` names the address of the
  backup process the supervisor runs (``ps_backup_ready``, once per process).
* A process that dies is counted (``driver.policy.ps_restarts``: past the limit the job
  gives up). A backup is replaced. A primary with a live backup is offered to it
  (``TryFailOver``: the store decides); without one, or when the store says no, it is
  started again (``Launch`` with ``says_restart``), and the restart says what it loses.
* A shard given to its backup has failed over once its replica record says the backup
  serves it (``ps_failed_over``).
* Once stopping, nothing is started and no exit is news.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Union

from driver.events import PsBackupExited, PsBackupReady, PsExited, PsFailedOver, PsStarted
from driver.events.base import Event
from driver.policy.ps_restarts import RestartLimits, count_death, give_up
from driver.ps import messages as m
from driver.ps.messages import Handover, Role
from rendezvous.schema.ps import ReplicaRecord, ShardInfo


@dataclass(frozen=True)
class ShardView:
    """What the supervisor knows of shard ``index``: its primary (``primary_pid`` on
    ``host``) and backup (``backup_pid`` on ``backup_host``; the hosts stay known after
    their process died, for where the next one goes), the newest records of each
    (``primary_record``, ``backup_record``, ``replica``), the processes already said
    ready (``ready_pid``) and in step (``in_step_pid``), a failover under way
    (``failing_over``, until the backup serves), and the recent deaths of its processes
    (``deaths``, oldest first)."""

    index: int
    primary_pid: int | None = None
    host: str | None = None
    backup_pid: int | None = None
    backup_host: str | None = None
    primary_record: ShardInfo | None = None
    backup_record: ShardInfo | None = None
    replica: ReplicaRecord | None = None
    ready_pid: int | None = None
    in_step_pid: int | None = None
    failing_over: Handover | None = None
    deaths: tuple[float, ...] = ()

    @property
    def serves(self) -> bool:
        """Its primary said it serves."""
        return self.primary_pid is not None and self.ready_pid == self.primary_pid

    @property
    def backup_in_step(self) -> bool:
        return self.backup_pid is not None and self.in_step_pid == self.backup_pid

    @property
    def backup_address(self) -> str | None:
        """The address the running backup's own record gives."""
        record = self.backup_record
        if record is None or self.backup_pid is None or record.pid != self.backup_pid:
            return None
        return record.address


@dataclass(frozen=True)
class PSView:
    """The shards (``shards``, by index), with ``replicas`` backups each; ``stopping``
    once ``stop`` began; ``fatal``: the first reason the shards cannot go on."""

    shards: tuple[ShardView, ...]
    replicas: int = 0
    stopping: bool = False
    fatal: str | None = None

    @classmethod
    def fresh(cls, num_shards: int, replicas: int) -> PSView:
        return cls(tuple(ShardView(i) for i in range(num_shards)), replicas)

    def shard_ready(self, shard: ShardView) -> bool:
        return shard.serves and (not self.replicas or shard.backup_in_step)

    def not_ready(self) -> list[int]:
        """The shards not ready yet (serving, and with replicas their backup in step)."""
        return [s.index for s in self.shards if not self.shard_ready(s)]


@dataclass(frozen=True)
class Emit:
    event: Event


@dataclass(frozen=True)
class Launch:
    """Start shard ``index``'s ``role``; ``previous``: the host its last one ran on,
    ``primary_host``: the shard's (a backup goes elsewhere when it can).
    ``says_restart``: a primary started again, whose restart is said with what it lost."""

    index: int
    role: Role
    previous: str | None
    primary_host: str = ""
    says_restart: bool = False


@dataclass(frozen=True)
class TryFailOver:
    """Offer shard ``index``, whose primary ``dead_pid`` died, to its backup
    ``backup_pid`` (the store decides: ``FailOverAnswer``)."""

    index: int
    dead_pid: int
    backup_pid: int


@dataclass(frozen=True)
class GiveUp:
    """The shards cannot go on: the job ends (``reason``)."""

    reason: str


Action = Union[Emit, Launch, TryFailOver, GiveUp]
Decision = tuple[PSView, tuple[Action, ...]]
NOTHING: tuple[Action, ...] = ()


def decide(view: PSView, message: m.Message, now: float, limits: RestartLimits) -> Decision:
    """The view after ``message`` at ``now``, and what to do."""
    handler: Callable[[PSView, Any, float, RestartLimits], Decision] = _HANDLERS[type(message)]
    return handler(view, message, now, limits)


def _with(view: PSView, shard: ShardView) -> PSView:
    shards = list(view.shards)
    shards[shard.index] = shard
    return replace(view, shards=tuple(shards))


def _shard(view: PSView, index: int) -> ShardView | None:
    return view.shards[index] if 0 <= index < len(view.shards) else None


def _started(shard: ShardView) -> tuple[ShardView, tuple[Action, ...]]:
    """``ps_started`` when the newest record says the running primary serves, once."""
    info = shard.primary_record
    pid = shard.primary_pid
    if pid is None or info is None or not info.ready or info.pid != pid or shard.ready_pid == pid:
        return shard, NOTHING
    started = PsStarted(shard=shard.index, address=info.address, pid=pid)
    return replace(shard, ready_pid=pid), (Emit(started),)


def _in_step(shard: ShardView) -> tuple[ShardView, tuple[Action, ...]]:
    """``ps_backup_ready`` when the replica record names the running backup, once."""
    address, record, pid = shard.backup_address, shard.replica, shard.backup_pid
    if pid is None or address is None or record is None or record.backup != address:
        return shard, NOTHING
    if shard.in_step_pid == pid:
        return shard, NOTHING
    ready = PsBackupReady(shard.index, address, pid, record.step)
    return replace(shard, in_step_pid=pid), (Emit(ready),)


def _launched(view: PSView, msg: m.Launched, now: float, limits: RestartLimits) -> Decision:
    shard = view.shards[msg.index]
    if msg.role is Role.PRIMARY:
        # A new primary is not ready until it says so; a failover it replaces is over.
        fresh = replace(shard, primary_pid=msg.pid, host=msg.host, ready_pid=None)
        shard, actions = _started(replace(fresh, failing_over=None))
    else:
        fresh = replace(shard, backup_pid=msg.pid, backup_host=msg.host, in_step_pid=None)
        shard, actions = _in_step(fresh)
    return _with(view, shard), actions


def _adopted(view: PSView, msg: m.Adopted, now: float, limits: RestartLimits) -> Decision:
    shard = view.shards[msg.index]
    if msg.role is Role.PRIMARY:
        shard = replace(shard, primary_pid=msg.pid, host=msg.host, ready_pid=msg.pid)
        return _with(view, shard), NOTHING
    shard, actions = _in_step(replace(shard, backup_pid=msg.pid, backup_host=msg.host))
    return _with(view, shard), actions


def _update(
    view: PSView, index: int, change: Callable[[ShardView], tuple[ShardView, tuple[Action, ...]]]
) -> Decision:
    """``change`` applied to shard ``index``; a record of a shard the job does not have
    changes nothing."""
    shard = _shard(view, index)
    if shard is None:
        return view, NOTHING
    shard, actions = change(shard)
    return _with(view, shard), actions


def _primary_record(
    view: PSView, msg: m.PrimaryRecord, now: float, limits: RestartLimits
) -> Decision:
    return _update(view, msg.info.index, lambda s: _started(replace(s, primary_record=msg.info)))


def _backup_record(
    view: PSView, msg: m.BackupRecord, now: float, limits: RestartLimits
) -> Decision:
    return _update(view, msg.info.index, lambda s: _in_step(replace(s, backup_record=msg.info)))


def _replica_seen(view: PSView, msg: m.ReplicaSeen, now: float, limits: RestartLimits) -> Decision:
    record = msg.record
    shard = _shard(view, record.index)
    if shard is None:
        return view, NOTHING
    shard = replace(shard, replica=record)
    said: tuple[Action, ...] = NOTHING
    moved = shard.failing_over
    if moved is not None and record.serving and record.primary == moved.backup:
        shard = replace(shard, failing_over=None)
        said = (Emit(PsFailedOver(record.index, moved.dead, moved.backup, record.step)),)
    shard, ready = _in_step(shard)
    return _with(view, shard), said + ready


def _exited(view: PSView, msg: m.Exited, now: float, limits: RestartLimits) -> Decision:
    shard = view.shards[msg.index]
    primary, backup = msg.pid == shard.primary_pid, msg.pid == shard.backup_pid
    if view.stopping or not (primary or backup):
        return view, NOTHING  # the job's end, or a process the shard no longer counts on
    if backup:
        shard = replace(shard, backup_pid=None, in_step_pid=None)
    said = Emit((PsExited if primary else PsBackupExited)(shard=msg.index, code=msg.code))
    shard = replace(shard, deaths=count_death(shard.deaths, now, limits))
    reason = give_up(msg.index, shard.deaths, msg.code, limits)
    if reason is not None:
        view, gave_up = _give_up(_with(view, shard), reason)
        return view, (said, *gave_up)
    then: Action
    if backup:
        then = Launch(msg.index, Role.BACKUP, shard.backup_host, shard.host or "")
    elif view.replicas and shard.backup_pid is not None:
        then = TryFailOver(msg.index, msg.pid, shard.backup_pid)
    else:
        then = Launch(msg.index, Role.PRIMARY, shard.host, says_restart=True)
    return _with(view, shard), (said, then)


def _failover_answer(
    view: PSView, msg: m.FailOverAnswer, now: float, limits: RestartLimits
) -> Decision:
    shard = view.shards[msg.index]
    if view.stopping:
        return view, NOTHING
    if msg.handover is None or shard.backup_pid is None:
        return view, (Launch(msg.index, Role.PRIMARY, shard.host, says_restart=True),)
    # The backup serves the shard now; a new backup is started for it.
    shard = replace(
        shard,
        primary_pid=shard.backup_pid,
        host=shard.backup_host,
        ready_pid=None,
        backup_pid=None,
        backup_host=None,
        in_step_pid=None,
        failing_over=msg.handover,
    )
    return _with(view, shard), (Launch(msg.index, Role.BACKUP, None, shard.host or ""),)


def _give_up(view: PSView, reason: str) -> Decision:
    if view.stopping:
        return view, NOTHING
    return replace(view, fatal=view.fatal or reason), (GiveUp(reason),)


def _fatal(view: PSView, msg: m.Fatal, now: float, limits: RestartLimits) -> Decision:
    return _give_up(view, msg.reason)


def _stop(view: PSView, msg: m.Stop, now: float, limits: RestartLimits) -> Decision:
    return replace(view, stopping=True), NOTHING


_HANDLERS: dict[type, Callable[[PSView, Any, float, RestartLimits], Decision]] = {
    m.Launched: _launched,
    m.Adopted: _adopted,
    m.PrimaryRecord: _primary_record,
    m.BackupRecord: _backup_record,
    m.ReplicaSeen: _replica_seen,
    m.Exited: _exited,
    m.FailOverAnswer: _failover_answer,
    m.Fatal: _fatal,
    m.Stop: _stop,
}
