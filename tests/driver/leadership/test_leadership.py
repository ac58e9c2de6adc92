"""Leadership and takeover as pure rules: what a starting driver does
(``driver.leadership.terms``), fencing and what a failed fence means, the worker's refusal of
an older term's plan (``rendezvous.schema.rounds.plan_is_current``), the leader's persisted state
and a successor's view rebuilt from the store's records (``driver.leadership.persisted``)."""

from __future__ import annotations

import pytest

from driver.events import HostBlacklisted
from driver.hosts.manager import BlacklistPolicy, HostManager
from driver.leadership.persisted import (
    LOST_BEFORE_TAKEOVER,
    Cooldown,
    rebuild_view,
    state_changed,
    state_record,
)
from driver.leadership.terms import (
    ClaimAction,
    FenceFailure,
    after_failed_fence,
    claim_action,
    fence,
    job_alive,
    lost_reason,
    next_term,
    read_term,
)
from driver.policy.decisions import Book
from driver.policy.lifecycle import WorkerRecord, WorkerState
from driver.policy.memory.failures import FailureBook
from driver.policy.memory.rounds import RoundBook
from driver.policy.planner import WorkerSlot
from rendezvous.keys import JobKeys
from rendezvous.net.auth import secret_fingerprint
from rendezvous.schema.leader import DriverRecord, DriverStateRecord
from rendezvous.schema.rounds import Member, Plan, plan_is_current
from rendezvous.schema.workers import WorkerInfo
from rendezvous.store import Compare, KeyValue

pytestmark = pytest.mark.unit  # pure logic: no process, no socket

KEYS = JobKeys("j")
LEADER = DriverRecord("a1", "h1", 100, 1.0, term=3)


def kv(key: str, value: bytes = b"{}", lease: int = 0, create: int = 1) -> KeyValue:
    return KeyValue(key, value, create, create, 1, lease)


# ---------------------------------------------------------------- starting a driver


def test_a_job_is_alive_only_by_leased_keys_other_than_the_leader():
    assert not job_alive([], KEYS)
    assert not job_alive([kv(KEYS.round), kv(KEYS.worker("w"))], KEYS)  # leftovers
    assert not job_alive([kv(KEYS.driver, lease=7)], KEYS)  # the leader alone
    assert job_alive([kv(KEYS.worker("w"), lease=9)], KEYS)
    assert job_alive([kv(f"{KEYS.prefix}agents/h1", lease=9)], KEYS)


@pytest.mark.parametrize(
    "leader, alive, standby, saw, action",
    [
        (LEADER, True, False, False, ClaimAction.REFUSE),
        (LEADER, False, False, False, ClaimAction.REFUSE),
        (LEADER, True, True, False, ClaimAction.WAIT),
        (None, True, False, False, ClaimAction.ADOPT),
        (None, True, True, True, ClaimAction.ADOPT),
        (None, False, False, False, ClaimAction.FRESH),
        (None, False, True, False, ClaimAction.FRESH),  # a standby with no job starts it
        (None, False, True, True, ClaimAction.ENDED),  # its leader went with the job
    ],
)
def test_claim_action(leader, alive, standby, saw, action):
    assert claim_action(leader, alive, standby=standby, saw_leader=saw) is action


def test_next_term_is_above_every_term_the_store_knows():
    assert read_term(None) == 0 and read_term(b"x") == 0 and read_term(b"4") == 4
    assert next_term(None) == 1
    assert next_term(b"4") == 5
    assert next_term(b"2", LEADER) == 4


# ---------------------------------------------------------------- fencing


def test_the_fence_holds_exactly_while_our_record_leads():
    assert fence(KEYS, LEADER) == [Compare(KEYS.driver, "value", "==", LEADER.to_json())]


def test_a_failed_fence_is_a_lost_lead_or_our_own_lapsed_lease():
    other = DriverRecord("b2", "h2", 200, 2.0, term=4)
    assert after_failed_fence(other, LEADER, 4) is FenceFailure.LOST
    assert after_failed_fence(None, LEADER, 4) is FenceFailure.LOST  # a newer term came
    assert after_failed_fence(None, LEADER, 3) is FenceFailure.RETAKE
    assert after_failed_fence(LEADER, LEADER, 3) is FenceFailure.RETAKE


def test_the_lost_lead_names_the_new_leader_on_one_line():
    other = DriverRecord("b2", "h2", 200, 2.0, term=4)
    reason = lost_reason("j", other, LEADER)
    assert "\n" not in reason and "term 3" in reason
    assert "driver pid 200 on host h2 (term 4)" in reason


def test_the_secret_fingerprint_says_nothing_of_the_secret():
    fingerprint = secret_fingerprint("s3cret")
    assert fingerprint == secret_fingerprint("s3cret") != secret_fingerprint("other")
    assert "s3cret" not in fingerprint and len(fingerprint) == 16


# ---------------------------------------------------------------- workers refuse old terms


def plan(round_id: int, term: int) -> Plan:
    return Plan(round_id, (Member("w", "h", 0, "a:1", 0, 0, 1, 0, 1),), term)


def test_a_worker_refuses_a_plan_of_an_older_term():
    assert plan_is_current(plan(1, 1), None, 0)
    assert plan_is_current(plan(5, 2), plan(4, 1), 1)  # the new leader's first round
    assert not plan_is_current(plan(6, 1), plan(5, 2), 2)  # a paused old leader woke up
    assert not plan_is_current(plan(5, 2), plan(5, 2), 2)  # not newer
    assert plan_is_current(plan(6, 0), plan(5, 0), 0)  # plans outside a job: no terms


def test_a_plan_keeps_its_term_and_old_records_read_as_term_0():
    assert Plan.from_json(plan(3, 7).to_json()).term == 7
    assert Plan.from_json(b'{"round_id": 2, "members": []}') == Plan(2, (), 0)


# ---------------------------------------------------------------- persisted state


def test_the_state_record_carries_what_a_successor_needs():
    rounds = RoundBook(
        0.0, resets=2, done_slots=frozenset({WorkerSlot("h1", 0)}), training_done_at=1.0
    )
    book = Book(rounds, failures=FailureBook(streak=1))
    stopping = WorkerRecord("h1-1-3", "h1", 1, 0.0, WorkerState.STOPPING)
    live = WorkerRecord("h1-2-4", "h1", 2, 0.0, WorkerState.REGISTERED)
    cooldowns = [Cooldown("h2", 2, 130.0), Cooldown("h3", 1, None)]
    record = state_record(
        5,
        book,
        cooldowns,
        4,
        {w.worker_id: w for w in (stopping, live)},
        "fp",
        now=100.0,
        wall_now=1000.0,
    )
    assert record.term == 5 and record.resets == 2 and record.failure_streak == 1
    assert record.blacklist == [["h2", 2, 1030.0]]  # wall clock: 30 s left
    assert record.strikes == [["h2", 2], ["h3", 1]]
    assert record.done_slots == [["h1", 0]] and record.training_done
    assert record.launched == 4 and record.given_up == [["h1-1-3", "stopping"]]
    assert DriverStateRecord.from_json(record.to_json()) == record


def test_only_news_is_worth_a_write():
    book = Book.start(0.0)
    first = state_record(1, book, [Cooldown("h", 1, 50.0)], 0, {}, "", now=0.0, wall_now=10.0)
    later = state_record(1, book, [Cooldown("h", 1, 50.0)], 0, {}, "", now=5.0, wall_now=15.2)
    assert state_changed(None, first)
    assert not state_changed(first, later)  # the same cooldown end, another moment
    grown = state_record(1, Book(RoundBook(0.0, resets=1)), [], 0, {}, "", now=5.0, wall_now=15.0)
    assert state_changed(first, grown)


# ---------------------------------------------------------------- a successor's view


def registration(worker_id: str, slot: int, pid: int, create: int) -> KeyValue:
    info = WorkerInfo(worker_id, "h1", slot, pid, f"127.0.0.1:{9000 + slot}")
    return kv(KEYS.worker(worker_id), info.to_json(), lease=5, create=create)


def members(*worker_ids: str) -> tuple[Member, ...]:
    return tuple(
        Member(w, "h1", i, f"127.0.0.1:{9000 + i}", i, i, len(worker_ids), 0, 1)
        for i, w in enumerate(worker_ids)
    )


def test_a_successor_rebuilds_the_job_from_the_store():
    state = DriverStateRecord(
        term=2,
        resets=3,
        failure_streak=1,
        blacklist=[["h9", 2, 1060.0], ["h8", 1, 990.0]],  # h8's cooldown is over
        strikes=[["h9", 2], ["h8", 1]],
        done_slots=[],
        launched=7,
        given_up=[["h1-2-6", "stopping"]],
        secret_id="fp",
    )
    kvs = [
        kv(KEYS.round, Plan(4, members("h1-0-5", "h1-1-7"), 2).to_json()),
        registration("h1-0-5", 0, 50, create=10),
        registration("h1-1-7", 1, 70, create=12),
        registration("h1-2-6", 2, 60, create=11),
        kv(KEYS.driver_state, state.to_json()),
    ]
    view = rebuild_view(kvs, KEYS, now=500.0, wall_now=1000.0)
    assert view.plan is not None and view.plan.round_id == 4 and view.plan.term == 2
    assert {w: r.state for w, r in view.workers.items()} == {
        "h1-0-5": WorkerState.REGISTERED,
        "h1-1-7": WorkerState.REGISTERED,
        "h1-2-6": WorkerState.STOPPING,
    }
    assert view.workers["h1-1-7"].registered_seq == 12  # rank order survives
    assert view.pids == {"h1-0-5": ("h1", 50), "h1-1-7": ("h1", 70), "h1-2-6": ("h1", 60)}
    assert view.book.rounds.resets == 3 and view.book.failures.streak == 1
    assert view.book.rounds.change_at is None  # the round is whole: nothing to re-form
    assert view.launched == 7 and view.secret_id == "fp"
    assert set(view.cooldowns) == {Cooldown("h9", 2, 560.0), Cooldown("h8", 1, None)}


def test_members_gone_before_the_takeover_are_lost_or_finished():
    kvs = [
        kv(KEYS.round, Plan(2, members("h1-0-1", "h1-1-2", "h1-2-3"), 1).to_json()),
        registration("h1-0-1", 0, 10, create=5),
        kv(KEYS.finished("h1-2-3"), b"{}"),
    ]
    view = rebuild_view(kvs, KEYS, now=50.0, wall_now=1000.0)
    lost, done = view.workers["h1-1-2"], view.workers["h1-2-3"]
    assert lost.state is WorkerState.FAILED and lost.kill_reason == LOST_BEFORE_TAKEOVER
    assert not lost.died_on_its_own  # not held against its host or the lost-round rule
    assert done.state is WorkerState.FINISHED and done.exit_code == 0
    assert view.book.training_done and ("h1", 2) in view.book.rounds.done_slots
    assert view.book.rounds.change_at == 50.0  # the round lost members: re-form from now
    assert view.launched == 3  # from the ids: no record of the state was written


def test_a_job_without_any_plan_or_state_rebuilds_empty():
    view = rebuild_view([kv(KEYS.ps_config)], KEYS, now=1.0, wall_now=2.0)
    assert view.plan is None and view.workers == {} and view.launched == 0
    assert view.book == Book.start(1.0)


def test_the_host_manager_takes_over_strikes_and_cooldowns():
    hosts = HostManager(BlacklistPolicy(cooldown_min=10, cooldown_max=100), min_np=1)
    hosts.restore("h2", 2, 130.0)
    hosts.restore("h3", 1, None)
    assert hosts.is_blacklisted("h2") and not hosts.is_blacklisted("h3")
    assert hosts.cooldowns() == (("h2", 2, 130.0), ("h3", 1, None))
    assert [e.host for e in hosts.release_expired(131.0)] == ["h2"]
    (event,) = hosts.host_lost("h3", 200.0)
    assert isinstance(event, HostBlacklisted) and event.strikes == 2  # strikes go on


# ---------------------------------------------------------------- agents handed over


def test_a_successor_takes_over_the_agents_and_what_they_run():
    from driver.launch.assignments.launcher import AgentLauncher
    from driver.launch.assignments.service import AgentStarts
    from driver.launch.registry import get_launcher
    from rendezvous.schema.agents import AgentRecord, Assignment, ProcessStatus

    local = get_launcher("local")
    launcher = AgentLauncher(
        local, local, AgentStarts("j", 60, detach=True), use_agent=lambda h: True
    )

    def assigned(process_id: str, kind: str, label: str) -> KeyValue:
        a = Assignment(process_id, kind, 0, ("python", "x.py"), term=1, label=label)
        return kv(KEYS.assignment("h1", process_id), a.to_json())

    def status(process_id: str, pid: int, state: str = "running") -> KeyValue:
        s = ProcessStatus(process_id, "h1", pid, state, 1.0, term=1)
        return kv(KEYS.process("h1", process_id), s.to_json())

    kvs = [
        kv(KEYS.agent("h1"), AgentRecord("h1", 11, 1.0, 1, "", "ag1").to_json(), lease=3),
        assigned("h1-0-1", "worker", "h1:0"),
        status("h1-0-1", 101),
        assigned("h1-1-2", "worker", "h1:1"),
        status("h1-1-2", 102, state="exited"),  # gone: nothing to hand over
        assigned("ps0-1", "shard", "ps0"),
        status("ps0-1", 201),
        assigned("h1-2-3", "worker", "h1:2"),  # never reported: not running
        # A host whose agent is gone: its processes are lost with it.
        kv(KEYS.assignment("h2", "h2-0-4"), Assignment("h2-0-4", "worker", 0, ("x",), 1).to_json()),
        kv(
            KEYS.process("h2", "h2-0-4"), ProcessStatus("h2-0-4", "h2", 9, "running", 1.0).to_json()
        ),
    ]
    handles = launcher.adopt(kvs)
    assert {k: h.pid for k, h in handles.items()} == {"h1-0-1": 101, "ps0-1": 201}
    assert handles["ps0-1"].spec.label == "ps0" and handles["h1-0-1"].poll() is None


# ---------------------------------------------------------------- the flag


def test_standby_needs_etcd_the_job_id_and_the_secret(monkeypatch):
    from driver.config import parse_args, unshared_secret_note
    from driver.errors import UsageError

    monkeypatch.delenv("ELASTIC_JOB_SECRET", raising=False)
    with pytest.raises(UsageError, match="--standby needs the job's secret"):
        parse_args(
            ["-np", "1", "--standby", "--rendezvous", "etcd://127.0.0.1:2379", "--job-id", "j", "t"]
        )
    alone = parse_args(["-np", "1", "--rendezvous", "etcd://127.0.0.1:2379", "true"])
    assert "no other driver" in (unshared_secret_note(alone) or "")
    assert unshared_secret_note(parse_args(["-np", "1", "true"])) is None  # embedded
    monkeypatch.setenv("ELASTIC_JOB_SECRET", "s3cret")
    assert unshared_secret_note(alone) is None

    etcd = ["-np", "1", "--rendezvous", "etcd://127.0.0.1:2379"]
    with pytest.raises(UsageError, match="--standby needs"):
        parse_args(["-np", "1", "--standby", "true"])
    with pytest.raises(UsageError, match="--standby needs"):
        parse_args(["--standby", *etcd, "true"])
    with pytest.raises(UsageError, match="--standby needs"):
        parse_args(["-np", "1", "--standby", "--job-id", "j", "true"])
    assert parse_args(["--standby", *etcd, "--job-id", "j", "true"]).standby
    assert not parse_args([*etcd, "--job-id", "j", "true"]).standby
