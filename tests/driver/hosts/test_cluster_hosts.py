"""The pure parts of ``--launcher slurm`` and ``--ray``: which node states leave the
job, the slots of the allocation's nodes, the ``srun`` line of a step, a Ray cluster's
alive nodes, and the flags. (The real Slurm and Ray run in ``tests/system/join/``.)"""

from __future__ import annotations

import pytest

from driver.config import parse_args
from driver.errors import UsageError
from driver.hosts.ray import alive_hosts
from driver.hosts.slots import HostSlots
from driver.hosts.slurm import allocation_slots, node_usable
from driver.launch.spec import LaunchSpec
from driver.launch.srun import srun_argv

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("state", "usable"),
    [
        ("idle", True),
        ("alloc", True),
        ("mix", True),
        ("down", False),
        ("down*", False),
        ("drain", False),
        ("drng", False),
        ("drain*", False),
        ("alloc*", True),  # not responding: one missed ping, not a lost node
        ("fail", False),
        ("maint", False),
        ("idle~", True),  # powered down, can be woken
    ],
)
def test_nodes_slurm_marks_down_or_drained_leave(state, usable):
    assert node_usable(state) is usable


def test_slots_come_from_the_flag_else_gpus_else_tasks_per_node():
    nodes = ["n1", "n2", "n3"]
    assert allocation_slots(nodes, {"SLURM_GPUS_ON_NODE": "4"}, 2) == dict.fromkeys(nodes, 2)
    assert allocation_slots(nodes, {"SLURM_GPUS_ON_NODE": "4"}, None) == dict.fromkeys(nodes, 4)
    tasks = {"SLURM_TASKS_PER_NODE": "2(x2),1"}
    assert allocation_slots(nodes, tasks, None) == {"n1": 2, "n2": 2, "n3": 1}
    assert allocation_slots(nodes, {}, None) == dict.fromkeys(nodes, 1)


def test_a_step_is_one_task_on_its_node_beside_the_others():
    spec = LaunchSpec(host="n2", slot=0, command=["python", "-m", "driver.agent"], env={})
    argv = srun_argv(spec, "/work")
    assert argv[0] == "srun" and argv[-3:] == ["python", "-m", "driver.agent"]
    for flag in ("--overlap", "--no-kill", "--nodes=1", "--ntasks=1", "--nodelist=n2"):
        assert flag in argv
    assert "--chdir=/work" in argv


def test_a_ray_clusters_alive_nodes_are_the_hosts_once_each():
    nodes = [
        {"NodeManagerAddress": "10.0.0.1", "Alive": True, "Resources": {"CPU": 8.0}},
        {"NodeManagerAddress": "10.0.0.2", "Alive": False, "Resources": {"GPU": 4.0}},
        {"NodeManagerAddress": "10.0.0.2", "Alive": True, "Resources": {"GPU": 4.0}},
        {"NodeManagerAddress": "10.0.0.2", "Alive": True, "Resources": {"GPU": 4.0}},
    ]
    assert alive_hosts(nodes, None) == (HostSlots("10.0.0.1", 1), HostSlots("10.0.0.2", 4))
    assert alive_hosts(nodes, 2) == (HostSlots("10.0.0.1", 2), HostSlots("10.0.0.2", 2))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ray", "auto", "-H", "a:2", "t.py"], "--ray takes its hosts from the Ray cluster"),
        (["--ray", "auto", "--launcher", "ssh", "-np", "2", "t.py"], "drop --launcher ssh"),
        (["--launcher", "ray", "-np", "2", "t.py"], "--launcher ray needs --ray ADDRESS"),
    ],
)
def test_ray_flags_are_checked_in_one_line(argv, message):
    with pytest.raises(UsageError, match=message):
        parse_args(argv)


def test_ray_takes_its_hosts_and_launcher_from_the_cluster():
    config = parse_args(["--ray", "10.0.0.1:6379", "-np", "2", "t.py"])
    assert (config.ray, config.launcher, config.uses_discovery) == ("10.0.0.1:6379", "ray", True)
