"""The ps supervisor's rules (``driver.ps.rules``, pure): each message with the time it
comes at (a fake clock: plain numbers), the view after it and the actions it asks for."""

from __future__ import annotations

import typing

import pytest

from driver.events import PsBackupExited, PsBackupReady, PsExited, PsFailedOver, PsStarted
from driver.policy.ps_restarts import RestartLimits, count_death, give_up
from driver.ps import messages as m
from driver.ps import rules
from driver.ps.messages import Handover, Role
from rendezvous.schema.ps import ReplicaRecord, ShardInfo

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

LIMITS = RestartLimits(max_restarts=2, window=10.0)


class Run:
    """The rules fed one message after another, the actions of each kept."""

    def __init__(self, num_shards: int = 1, replicas: int = 0):
        self.view = rules.PSView.fresh(num_shards, replicas)

    def __call__(self, message: m.Message, now: float = 0.0) -> tuple[rules.Action, ...]:
        self.view, actions = rules.decide(self.view, message, now, LIMITS)
        return actions


def ready(index: int, pid: int, address: str = "h:1", up: bool = True) -> m.PrimaryRecord:
    return m.PrimaryRecord(ShardInfo(index, 1, address, pid, ready=up))


def events(actions: tuple[rules.Action, ...]) -> list:
    return [a.event for a in actions if isinstance(a, rules.Emit)]


def test_a_shard_is_ready_on_its_own_process_record_once():
    run = Run()
    assert run(m.Launched(0, Role.PRIMARY, 100, "h")) == ()
    assert run(ready(0, pid=99)) == ()  # a dead shard's record is not its replacement's
    assert run(ready(0, pid=100, up=False)) == ()  # restoring a checkpoint
    assert run.view.not_ready() == [0]
    assert events(run(ready(0, pid=100))) == [PsStarted(shard=0, address="h:1", pid=100)]
    assert run(ready(0, pid=100)) == () and run.view.not_ready() == []


def test_a_record_that_came_before_the_news_of_its_launch_counts():
    run = Run()
    run(ready(0, pid=100))
    assert events(run(m.Launched(0, Role.PRIMARY, 100, "h"))) == [PsStarted(0, "h:1", 100)]


def test_an_adopted_primary_served_its_predecessor():
    run = Run(replicas=1)
    assert run(m.Adopted(0, Role.PRIMARY, 100, "h")) == ()
    assert run.view.shards[0].serves and run.view.not_ready() == [0]  # no backup in step


def test_a_backup_is_in_step_once_the_replica_record_names_its_address():
    run = Run(replicas=1)
    run(m.Launched(0, Role.PRIMARY, 100, "a"))
    run(ready(0, pid=100, address="a:1"))
    run(m.Launched(0, Role.BACKUP, 200, "b"))
    assert run(m.ReplicaSeen(ReplicaRecord(0, "a:1", "b:2", step=5))) == ()  # whose is b:2?
    said = events(run(m.BackupRecord(ShardInfo(0, 1, "b:2", 200))))
    assert said == [PsBackupReady(0, "b:2", 200, 5)] and run.view.not_ready() == []
    assert run(m.ReplicaSeen(ReplicaRecord(0, "a:1", "b:2", step=9))) == ()  # once


def test_a_dead_primary_restarts_until_it_died_too_often_within_the_window():
    run = Run()
    run(m.Launched(0, Role.PRIMARY, 100, "h"))
    first = run(m.Exited(0, 100, 3), now=0.0)
    assert events(first) == [PsExited(shard=0, code=3)]
    assert first[1] == rules.Launch(0, Role.PRIMARY, "h", says_restart=True)
    run(m.Launched(0, Role.PRIMARY, 101, "h"))
    run(m.Exited(0, 101, 3), now=1.0)
    run(m.Launched(0, Role.PRIMARY, 102, "h"))
    last = run(m.Exited(0, 102, 3), now=2.0)
    reason = "ps shard 0 died 3 times within 10s (last exit: 3); giving up"
    assert last[1:] == (rules.GiveUp(reason),) and run.view.fatal == reason


def test_deaths_older_than_the_window_are_forgotten():
    deaths: tuple[float, ...] = ()
    for now in (0.0, 6.0, 12.0, 18.0):
        deaths = count_death(deaths, now, LIMITS)
        assert give_up(0, deaths, 1, LIMITS) is None
    assert deaths == (12.0, 18.0)


def test_a_process_the_shard_no_longer_counts_on_is_no_news():
    run = Run()
    run(m.Launched(0, Role.PRIMARY, 101, "h"))
    assert run(m.Exited(0, 100, -9)) == () and run.view.shards[0].deaths == ()


def test_a_dead_backup_is_replaced_near_its_shard():
    run = Run(replicas=1)
    run(m.Launched(0, Role.PRIMARY, 100, "a"))
    run(m.Launched(0, Role.BACKUP, 200, "b"))
    actions = run(m.Exited(0, 200, -9))
    assert events(actions) == [PsBackupExited(shard=0, code=-9)]
    assert actions[1] == rules.Launch(0, Role.BACKUP, "b", "a")
    assert run.view.shards[0].backup_pid is None


def test_a_dead_primary_with_a_backup_fails_over_and_the_failover_is_said_once_it_serves():
    run = Run(replicas=1)
    run(m.Launched(0, Role.PRIMARY, 100, "a"))
    run(m.Launched(0, Role.BACKUP, 200, "b"))
    assert run(m.Exited(0, 100, -9))[1] == rules.TryFailOver(0, 100, 200)
    handover = Handover("a:1", "b:2")
    assert run(m.FailOverAnswer(0, handover)) == (rules.Launch(0, Role.BACKUP, None, "b"),)
    shard = run.view.shards[0]
    assert (shard.primary_pid, shard.host, shard.backup_pid) == (200, "b", None)
    assert run(m.ReplicaSeen(ReplicaRecord(0, "b:2", "", 7, serving=False))) == ()
    said = events(run(m.ReplicaSeen(ReplicaRecord(0, "b:2", "", 8, serving=True))))
    assert said == [PsFailedOver(0, "a:1", "b:2", 8)] and run.view.shards[0].failing_over is None


def test_a_failover_the_store_refuses_restarts_the_shard():
    run = Run(replicas=1)
    run(m.Launched(0, Role.PRIMARY, 100, "a"))
    run(m.Launched(0, Role.BACKUP, 200, "b"))
    run(m.Exited(0, 100, -9))
    restart = rules.Launch(0, Role.PRIMARY, "a", says_restart=True)
    assert run(m.FailOverAnswer(0, None)) == (restart,)


def test_once_stopping_no_exit_is_news_and_nothing_is_fatal():
    run = Run()
    run(m.Launched(0, Role.PRIMARY, 100, "h"))
    run(m.Stop())
    assert run(m.Exited(0, 100, -15)) == () and run(m.Fatal("store lost")) == ()
    assert run.view.fatal is None


def test_the_first_fatal_reason_is_kept_and_each_is_said():
    run = Run()
    assert run(m.Fatal("store lost")) == (rules.GiveUp("store lost"),)
    assert run(m.Fatal("again")) == (rules.GiveUp("again"),)
    assert run.view.fatal == "store lost"


def test_records_of_shards_the_job_does_not_have_are_ignored():
    run = Run()
    assert run(ready(5, pid=1)) == () and run(m.BackupRecord(ShardInfo(5, 1, "x:1", 2))) == ()


def test_every_message_has_its_named_rule():
    assert set(typing.get_args(m.Message)) == set(rules._HANDLERS)
