"""The agent's reconcile rule and its records (pure: no process, no store)."""

from __future__ import annotations

import pytest

from driver.agent.rules import (
    AgentView,
    Kill,
    NeverStarted,
    ProcState,
    Refuse,
    Shutdown,
    Start,
    Stop,
    leader_seen,
    reconcile,
)
from rendezvous.keys import JobKeys
from rendezvous.schema.agents import AgentRecord, Assignment, ProcessStatus, leader_term
from rendezvous.schema.leader import DriverRecord

pytestmark = pytest.mark.unit  # pure logic: no process, no socket

TIMEOUT = 300.0


def assigned(pid: str, term: int = 1, want: str = "run") -> Assignment:
    return Assignment(pid, "worker", 0, ("python", "train.py"), term, want=want)


def run(assignments, processes, view=None, now=0.0):
    return reconcile({a.id: a for a in assignments}, processes, view or AgentView(), now, TIMEOUT)


def test_a_new_assignment_is_started_once():
    a = assigned("w1")
    actions, _ = run([a], {})
    assert actions == [Start(a)]
    actions, _ = run([a], {"w1": ProcState.RUNNING})
    assert actions == []
    # Ended: never started again (a replacement has a new id).
    actions, _ = run([a], {"w1": ProcState.EXITED})
    assert actions == []


def test_stop_and_kill_reach_running_processes_only():
    actions, _ = run([assigned("w1", want="stop")], {"w1": ProcState.RUNNING})
    assert actions == [Stop("w1")]
    actions, _ = run([assigned("w1", want="stop")], {"w1": ProcState.STOPPING})
    assert actions == []
    actions, _ = run([assigned("w1", want="kill")], {"w1": ProcState.STOPPING})
    assert actions == [Kill("w1")]
    actions, _ = run([assigned("w1", want="kill")], {"w1": ProcState.EXITED})
    assert actions == []


def test_an_assignment_taken_back_before_it_started_is_reported_ended():
    a = assigned("w1", want="stop")
    actions, _ = run([a], {})
    assert actions == [NeverStarted(a)]


def test_a_process_whose_assignment_vanished_is_stopped():
    actions, _ = run([], {"w1": ProcState.RUNNING, "w2": ProcState.EXITED})
    assert actions == [Stop("w1")]


def test_an_older_terms_assignment_is_refused_once_and_changes_nothing():
    view = leader_seen(AgentView(), 2, now=0.0)
    stale_run = assigned("w9", term=1)
    stale_kill = assigned("w1", term=1, want="kill")
    actions, view = run([stale_run, stale_kill], {"w1": ProcState.RUNNING}, view)
    assert actions == [Refuse(stale_kill, 2), Refuse(stale_run, 2)]
    actions, view = run([stale_run, stale_kill], {"w1": ProcState.RUNNING}, view)
    assert actions == []  # said once; and neither started nor killed anything


def test_an_assignment_of_a_newer_term_raises_the_highest_term():
    new = assigned("w2", term=3)
    old = assigned("w1", term=2, want="kill")
    actions, view = run([new, old], {"w1": ProcState.RUNNING})
    assert view.highest_term == 3
    assert Start(new) in actions and Refuse(old, 3) in actions
    assert not any(isinstance(a, Kill) for a in actions)


def test_the_new_leader_may_steer_processes_an_older_leader_started():
    view = leader_seen(AgentView(), 2, now=0.0)
    actions, _ = run([assigned("w1", term=2, want="stop")], {"w1": ProcState.RUNNING}, view)
    assert actions == [Stop("w1")]


def test_no_leader_for_the_driver_timeout_shuts_down():
    view = leader_seen(AgentView(highest_term=1), None, now=10.0)
    actions, _ = run([assigned("w1")], {"w1": ProcState.RUNNING}, view, now=10.0 + TIMEOUT - 1)
    assert actions == []
    actions, _ = run([assigned("w1")], {"w1": ProcState.RUNNING}, view, now=10.0 + TIMEOUT)
    assert actions == [Shutdown(f"no driver for {TIMEOUT:g}s (--driver-timeout)")]


def test_a_leader_coming_back_clears_the_timeout_and_absence_keeps_its_start():
    view = leader_seen(AgentView(), None, now=5.0)
    assert leader_seen(view, None, now=50.0).leader_gone_since == 5.0
    back = leader_seen(view, 4, now=60.0)
    assert back.leader_gone_since is None and back.highest_term == 4
    assert leader_seen(back, 2, now=61.0).highest_term == 4  # terms never go down


def test_the_jobs_end_shuts_down():
    actions, _ = run([assigned("w1")], {"w1": ProcState.RUNNING}, AgentView(ended=True))
    assert actions == [Shutdown("the job is over")]


def test_records_round_trip_and_reject_nonsense():
    a = Assignment("w1", "shard", 2, ("python", "-m", "x"), 3, env={"A": "1"}, want="kill")
    assert Assignment.from_json(a.to_json()) == a and a.command == ("python", "-m", "x")
    with pytest.raises(ValueError, match="kind"):
        Assignment("w1", "daemon", 0, ("x",), 1)
    with pytest.raises(ValueError, match="want"):
        Assignment("w1", "worker", 0, ("x",), 1, want="pause")
    with pytest.raises(ValueError):
        Assignment.from_json(b'{"id": "w1"}')
    status = ProcessStatus("w1", "h", 12, "exited", 1.0, term=2, code=-9, ended=2.0)
    assert ProcessStatus.from_json(status.to_json()) == status and status.exited
    record = AgentRecord("h", 5, 1.0, 2, "/tmp/log", "abc")
    assert AgentRecord.from_json(record.to_json()) == record


def test_leader_term_reads_the_leader_record():
    assert leader_term(DriverRecord("d", "h", 1, 0.0, term=7).to_json()) == 7
    assert leader_term(None) is None and leader_term(b"junk") is None


def test_agent_keys_keep_a_host_or_id_in_one_segment():
    keys = JobKeys("j")
    assert keys.agent("10.0.0.2") == "/elastic/j/agents/10.0.0.2"
    assert keys.assignment("h/x", "w1") == "/elastic/j/assign/h%2Fx/w1"
    assert keys.assignment("h", "w1").startswith(keys.assignments("h"))
    assert keys.process("h", "w1").startswith(keys.processes)


def test_a_spread_shard_keeps_its_host_while_usable_and_moves_when_lost():
    from driver.hosts.shard_placement import DRIVER_HOST, spread_host

    assert spread_host(0, None, ["a", "b"]) == "a"
    assert spread_host(3, None, ["a", "b"]) == "b"
    assert spread_host(0, "b", ["a", "b"]) == "b"  # a restart stays while the host is usable
    assert spread_host(0, "a", ["b", "c"]) == "b"  # its host lost: another usable host
    assert spread_host(1, "a", []) == DRIVER_HOST


def test_a_backup_runs_on_another_usable_host_than_its_shard():
    from driver.hosts.shard_placement import backup_host

    assert backup_host(0, "a", None, ["a", "b", "c"]) == "b"  # the host after the shard's
    assert backup_host(2, "c", None, ["a", "b", "c"]) == "a"  # round robin
    assert backup_host(0, "a", "c", ["a", "b", "c"]) == "c"  # it stays while usable
    assert backup_host(0, "a", "a", ["a", "b"]) == "b"  # never on the shard's own host
    assert backup_host(1, "x", None, ["a", "b"]) == "b"  # the shard's host is not usable
    assert backup_host(0, "a", None, ["a"]) == "a"  # one host: beside the shard


def test_a_backup_takes_over_only_while_the_record_names_it_in_step():
    from driver.ps.failover import promotion
    from rendezvous.schema.ps import ReplicaRecord

    record = ReplicaRecord(1, "p:1", "b:2", step=40)
    assert promotion(record, "p:1", "b:2") == ReplicaRecord(1, "b:2", "", 40, serving=False)
    assert promotion(record, "p:1", "c:3") is None  # another backup than the one in step
    assert promotion(record, "q:1", "b:2") is None  # not the primary that died
    assert promotion(ReplicaRecord(1, "p:1", "", 40), "p:1", "b:2") is None  # dropped
    assert promotion(ReplicaRecord(1, "p:1", "b:2", serving=False), "p:1", "b:2") is None
    assert promotion(None, "p:1", "b:2") is None and promotion(record, None, "b:2") is None
