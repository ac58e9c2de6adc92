"""The pure parts of ``--launcher slurm``: which node states leave the job, the slots
of the allocation's nodes, and the ``srun`` line of a step. (The real Slurm runs in
``tests/system/join/test_slurm_launcher.py``.)"""

from __future__ import annotations

import pytest

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
        ("alloc*", False),  # not responding
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
