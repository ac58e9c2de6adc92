"""Join mode's pure parts: the joined hosts from the agents' records, the shape every
node must agree on, the flags' checks, and whether a node may join a job that ended."""

from __future__ import annotations

import time

import pytest

from driver.config import parse_args
from driver.errors import UsageError
from driver.hosts.discovery import HostDiscovery
from driver.hosts.joined import JoinedDiscovery, joined_hosts
from driver.hosts.slots import HostSlots
from driver.join.ended import (
    DONE,
    FAILED,
    OUTCOME_KEPT,
    STOPPED,
    JobOutcome,
    record_outcome,
    refusal,
)
from driver.join.settings import slurm_slots, tasks_on_node
from driver.join.shape import check_shape, job_shape, shape_bytes, shape_difference
from rendezvous.keys import JobKeys
from rendezvous.schema.agents import AgentRecord

ETCD = "etcd://127.0.0.1:2379"


def record(host: str, started: float, slots: int) -> bytes:
    return AgentRecord(host, pid=1, started=started, slots=slots).to_json()


def test_the_joined_hosts_are_the_nodes_with_slots_first_joined_first():
    values = [record("b", 2.0, 4), record("a", 1.0, 2), record("ssh", 0.5, 0), b"{not json"]
    assert joined_hosts(values) == (HostSlots("a", 2), HostSlots("b", 4))


class Listed(HostDiscovery):
    def __init__(self, *hosts: HostSlots):
        self.hosts = hosts

    def find_hosts(self) -> tuple[HostSlots, ...]:
        return self.hosts


def test_hosts_of_h_or_a_script_come_after_the_nodes_a_host_that_is_both_the_nodes():
    found = JoinedDiscovery(
        lambda: [record("b", 2.0, 4), record("a", 1.0, 2)],
        also=Listed(HostSlots("c", 1), HostSlots("a", 8)),
    )
    assert found.find_hosts() == (HostSlots("a", 2), HostSlots("b", 4), HostSlots("c", 1))


def test_join_with_h_keeps_the_hosts_beside_the_nodes_and_their_slots_count_later(monkeypatch):
    monkeypatch.setenv("ELASTIC_JOB_SECRET", "s3cret")
    config = parse_args(join("-H", "x:1"))  # -np 2, more than -H lists: nodes bring slots
    assert config.hosts == (HostSlots("x", 1),) and config.np == 2


def join(*extra: str) -> list[str]:
    return ["--join", "--rendezvous", ETCD, "--job-id", "j1", "-np", "2", *extra, "train.py"]


def test_the_shape_names_the_first_difference(monkeypatch):
    monkeypatch.setenv("ELASTIC_JOB_SECRET", "s3cret")
    mine = job_shape(parse_args(join()))
    assert shape_difference(mine, mine) == ""
    assert shape_difference(mine, {**mine, "np": 4}) == "-np 2 here, 4 in the job"
    assert shape_difference(mine, {**mine, "max_np": None, "np": 2, "min_np": 2}) == ""
    other = {**mine, "command": ["python", "other.py"]}
    assert "the command 'train.py' here, 'python other.py' in the job" in shape_difference(
        mine, other
    )


def test_every_node_runs_worlds_of_restart_mode_or_none_does(monkeypatch):
    monkeypatch.setenv("ELASTIC_JOB_SECRET", "s3cret")
    plain = job_shape(parse_args(join()))
    restarting = job_shape(parse_args(join("--restart-workers")))
    assert restarting["restart_workers"] and shape_difference(restarting, restarting) == ""
    assert shape_difference(restarting, plain) == "--restart-workers given here, not in the job"
    assert (
        shape_difference(plain, restarting) == "--restart-workers not given here, given in the job"
    )
    older = {k: v for k, v in plain.items() if k != "restart_workers"}  # before the key
    assert shape_difference(plain, older) == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--join", "--job-id", "j", "-np", "2", "t.py"], "--join needs --rendezvous etcd://"),
        (["--join", "--rendezvous", ETCD, "-np", "2", "t.py"], "--join needs --job-id"),
        (
            ["--join", "--rendezvous", ETCD, "--job-id", "j", "-H", "a:2", "t.py"],
            "--join needs -np or --min-np",
        ),
        (["--host-name", "a", "-np", "2", "t.py"], "--host-name is for join mode"),
        (["--new-job", "-np", "2", "t.py"], "--new-job is for join mode"),
    ],
)
def test_join_flags_are_checked_in_one_line(monkeypatch, argv, message):
    monkeypatch.setenv("ELASTIC_JOB_SECRET", "s3cret")
    with pytest.raises(UsageError, match=message):
        parse_args(argv)


def test_join_mode_without_a_secret_says_how_to_make_one(monkeypatch, tmp_path):
    monkeypatch.delenv("ELASTIC_JOB_SECRET", raising=False)
    with pytest.raises(UsageError, match=r"ELASTIC_JOB_SECRET.*secrets\.token_hex"):
        parse_args(join())
    empty = tmp_path / "secret"
    empty.write_text("\n")
    with pytest.raises(UsageError, match="the file is empty"):
        parse_args(join("--job-secret-file", str(empty)))
    empty.write_text("from-a-file\n")
    config = parse_args(join("--job-secret-file", str(empty)))
    assert config.join is not None and config.join.secret == "from-a-file"
    assert "from-a-file" not in repr(config.join)
    assert config.standby and config.uses_discovery


@pytest.mark.parametrize(
    ("spec", "node", "tasks"),
    [
        ("2(x3),1", 0, 2),
        ("2(x3),1", 2, 2),
        ("2(x3),1", 3, 1),
        ("4", 0, 4),
        ("1", 1, None),
        ("x", 0, None),
    ],
)
def test_slurms_tasks_per_node_are_read_per_node(spec, node, tasks):
    assert tasks_on_node(spec, node) == tasks


SLURM = {"SLURM_JOB_ID": "41", "SLURMD_NODENAME": "n2", "SLURM_NODEID": "1", "SLURM_LOCALID": "0"}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),  # not under Slurm
        ({**SLURM, "SLURM_GPUS_ON_NODE": "8", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}, (8, True)),
        ({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "4,2"}, (2, True)),
        ({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_LOCALID": "3"}, (4, False)),
        ({**SLURM, "SLURM_GPUS_ON_NODE": "0"}, (1, True)),
    ],
)
def test_under_slurm_a_node_offers_its_gpus_else_its_tasks(environ, expected):
    assert slurm_slots(environ) == expected


def test_join_settings_take_slurms_slots_unless_given(monkeypatch):
    monkeypatch.setenv("ELASTIC_JOB_SECRET", "s3cret")
    for name, value in {
        **SLURM,
        "SLURM_STEP_TASKS_PER_NODE": "3(x2)",
        "SLURM_LOCALID": "1",
    }.items():
        monkeypatch.setenv(name, value)
    config = parse_args(join())
    assert config.join is not None
    assert (config.join.host, config.join.slots, config.join.spare_task) == ("n2", 3, True)
    config = parse_args(join("--slots-per-host", "5"))
    assert config.join is not None and (config.join.slots, config.join.spare_task) == (5, False)


def test_a_node_checks_its_shape_against_the_stored_one(monkeypatch):
    monkeypatch.setenv("ELASTIC_JOB_SECRET", "s3cret")
    config = parse_args(join())
    check_shape(config, None)  # nothing stored yet: this node may lead
    check_shape(config, shape_bytes(config))
    other = parse_args(join()[:-2] + ["3", "train.py"])  # -np 3
    with pytest.raises(UsageError, match=r"this node disagrees with job 'j1': -np 3 here, 2"):
        check_shape(other, shape_bytes(config))


def test_the_node_named_by_an_embedded_store_serves_it(monkeypatch):
    monkeypatch.setenv("ELASTIC_JOB_SECRET", "s3cret")
    base = ["--join", "--rendezvous", "embedded://n1:29500", "--job-id", "j", "-np", "2"]
    served = parse_args([*base, "--host-name", "n1", "train.py"]).join
    other = parse_args([*base, "--host-name", "n2", "train.py"]).join
    assert served is not None and served.serves_port == 29500
    assert other is not None and other.serves_port is None
    with pytest.raises(UsageError, match=r"embedded://HOST:PORT \(the node named HOST"):
        parse_args(["--join", "--rendezvous", "embedded", "--job-id", "j", "-np", "2", "t.py"])


def test_new_job_reaches_the_join_settings(monkeypatch):
    monkeypatch.setenv("ELASTIC_JOB_SECRET", "s3cret")
    argv = ["--join", "--rendezvous", ETCD, "--job-id", "j", "-np", "2", "t.py"]
    plain, new = parse_args(argv), parse_args(["--new-job", *argv])
    assert plain.join is not None and not plain.join.new_job
    assert new.join is not None and new.join.new_job


def test_a_finished_or_failed_job_refuses_a_node_naming_how_and_when():
    at = 1_767_225_600.0  # (said in local time, as the driver's lines are)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    done = refusal("j1", JobOutcome(DONE, at, "job done in round 3 at step 120"), False, False)
    assert done == (
        f"--join: job 'j1' finished at {when} (job done in round 3 at step 120); a node that "
        "joins it now would train it again from the start: give --new-job to start a new "
        "job under this id, or another --job-id"
    )
    failed = refusal("j1", JobOutcome(FAILED, at, "reset limit exceeded"), False, False)
    assert failed is not None and f"job 'j1' failed at {when} (reset limit exceeded)" in failed


@pytest.mark.parametrize(
    "outcome,led,new_job",
    [
        (None, False, False),  # no job ended under the id
        (JobOutcome(STOPPED, 1.0, "SIGTERM"), False, False),  # stopped: resumable
        (JobOutcome(DONE, 1.0), True, False),  # a new job runs under the id
        (JobOutcome(DONE, 1.0), False, True),  # --new-job: start over
        (JobOutcome("unknown", 1.0), False, False),  # a newer writer's outcome
    ],
)
def test_a_node_may_join_unless_the_job_ended_and_nothing_runs_under_its_id(outcome, led, new_job):
    assert refusal("j1", outcome, led, new_job) is None


def test_an_outcome_is_kept_under_a_lease_that_ends_in_a_day(store_backend):
    # (a shared etcd does not gather every joined job's trace for ever)
    store, keys = store_backend.open(), JobKeys("j-kept")
    assert record_outcome(store, keys, JobOutcome(DONE, 1.0, "job done"), ())
    kv = store.get(keys.outcome)
    assert kv is not None and kv.lease != 0
    assert JobOutcome.from_json(kv.value) == JobOutcome(DONE, 1.0, "job done")
    assert 0 < store.keepalive(kv.lease) <= OUTCOME_KEPT
