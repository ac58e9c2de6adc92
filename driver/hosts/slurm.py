"""The hosts of the Slurm allocation this driver runs in (``--launcher slurm``): its
nodes that Slurm does not mark unusable, each with its slots; and the names Slurm gives
a task's job, node and slots in its environment (join mode reads them too).

* The nodes: the job's node list as Slurm has it now (``squeue``: a node that failed
  under ``sbatch --no-kill`` leaves it), expanded (``scontrol show hostnames``).
* The nodes that leave: those Slurm marks DOWN, DRAIN (draining or drained), FAIL or
  MAINT: an administrator's drain or a node Slurm lost is taken out of the job like a
  host discovery removed (its members leave at their next commit when they can:
  ``driver.policy.departures``). "Not responding" (``sinfo``'s ``*``) alone is not
  enough: Slurm says it after one missed ping (a busy node), and calls a node it lost
  DOWN after ``SlurmdTimeout``; a node really gone is found sooner by the job itself
  (its agent's lease, the ring's heartbeats).
* Slots: ``--slots-per-host`` when given, else the GPUs Slurm gave each node
  (``SLURM_GPUS_ON_NODE``), else the job's tasks on the node (``SLURM_TASKS_PER_NODE``,
  "2(x3),1"), else 1.

Node names are Slurm's labels: the driver routes toward their ``NodeAddr``
(``node_addresses``), never asking DNS for them. Every Slurm command runs with a deadline (``run_bounded``); one that fails or hangs is a
``DiscoveryError`` naming it (the job retries at the next interval).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from driver.errors import DiscoveryError
from driver.hosts.command import Commands, run_bounded
from driver.hosts.discovery import DEFAULT_SCRIPT_TIMEOUT, HostDiscovery
from driver.hosts.slots import HostSlots

SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_NODE_NAME = "SLURMD_NODENAME"
"""Slurm's names for a task's job and node: join mode's defaults for --job-id and
--host-name (``srun elastic-run --join ...`` needs neither)."""

SLURM_GPUS_ON_NODE = "SLURM_GPUS_ON_NODE"
SLURM_STEP_TASKS_PER_NODE = "SLURM_STEP_TASKS_PER_NODE"
SLURM_NODE_ID = "SLURM_NODEID"
SLURM_LOCAL_ID = "SLURM_LOCALID"
"""What Slurm tells a task of the node it runs on: its GPUs, the step's tasks on each
node ("2(x3),1"), the node's index in the step, and the task's index on the node:
join mode's default for --slots-per-host (``slurm_slots``)."""
SLURM_TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
SLURM_JOB_NODELIST = "SLURM_JOB_NODELIST"
"""The job's tasks on each of its nodes, and its nodes (Slurm's compact lists)."""


def tasks_on_node(tasks_per_node: str, node_index: int) -> int | None:
    """The tasks that Slurm's ``tasks_per_node`` ("2(x3),1": 2 on each of three nodes,
    then 1) puts on node ``node_index``; None when it does not say."""
    index = 0
    for part in tasks_per_node.split(","):
        count, _, repeat = part.partition("(x")
        try:
            tasks, times = int(count), int(repeat.rstrip(")") or 1)
        except ValueError:
            return None
        if node_index < index + times:
            return tasks
        index += times
    return None


UNUSABLE_STATES = ("down", "drain", "drng", "fail", "maint", "pow_dn", "powering_down")
"""Node states (``sinfo %t``, lower case, a trailing ``*``/``~``/``#`` aside) whose nodes
leave the job."""


def node_usable(state: str) -> bool:
    """Whether a node in ``sinfo``'s compact ``state`` can run the job's processes (a
    node not responding, ``*``, still can: see the module docstring)."""
    base = state.rstrip("~#!%$@^-*").lower()
    return not base.startswith(UNUSABLE_STATES)


def allocation_slots(
    nodes: Sequence[str], environ: Mapping[str, str], given: int | None
) -> dict[str, int]:
    """The slots of each of ``nodes`` (the allocation's, in Slurm's order); see the
    module docstring."""
    if given is not None:
        return dict.fromkeys(nodes, given)
    gpus = environ.get(SLURM_GPUS_ON_NODE, "")
    if gpus.isdigit() and int(gpus) > 0:
        return dict.fromkeys(nodes, int(gpus))
    tasks = environ.get(SLURM_TASKS_PER_NODE, "")
    return {node: tasks_on_node(tasks, i) or 1 for i, node in enumerate(nodes)}


class SlurmDiscovery(HostDiscovery):
    """The usable nodes of the Slurm job in ``environ`` (this process's), with their
    slots (module docstring); ``given_slots``: --slots-per-host, when given."""

    def __init__(
        self,
        environ: Mapping[str, str],
        given_slots: int | None = None,
        timeout: float = DEFAULT_SCRIPT_TIMEOUT,
    ):
        self.job_id = environ.get(SLURM_JOB_ID, "")
        self._environ = dict(environ)
        self._given = given_slots
        self._slots: dict[str, int] | None = None  # the allocation's, read once
        self._expanded: dict[str, list[str]] = {}  # compact node list -> its node names
        self.timeout = timeout
        self._commands = Commands()

    def __repr__(self) -> str:
        return f"SlurmDiscovery(job {self.job_id})"

    def cancel(self) -> None:
        self._commands.cancel()

    def find_hosts(self) -> tuple[HostSlots, ...]:
        """The job's nodes now, minus the unusable ones.

        Raises:
            DiscoveryError: not inside an allocation, or a Slurm command failed, hung
                or said nothing of the job.
        """
        if not self.job_id:
            raise DiscoveryError(f"{SLURM_JOB_ID} is not set: not inside a Slurm allocation")
        if self._slots is None:
            allocated = self._nodes(self._environ.get(SLURM_JOB_NODELIST, ""))
            self._slots = allocation_slots(allocated, self._environ, self._given)
        listed = self._run(["squeue", "-h", "-j", self.job_id, "-o", "%N"]).strip()
        if not listed:
            raise DiscoveryError(f"squeue lists no node for Slurm job {self.job_id}: it ended")
        states = dict(
            line.split()[:2]
            for line in self._run(["sinfo", "-h", "-N", "-n", listed, "-o", "%N %t"]).splitlines()
            if len(line.split()) >= 2
        )
        return tuple(
            HostSlots(node, self._slots.get(node, 1))
            for node in self._nodes(listed)
            if node_usable(states.get(node, "unknown"))
        )

    def _nodes(self, compact: str) -> list[str]:
        """The names in Slurm's ``compact`` list ("n[1-3,5]"), asked of ``scontrol``
        once per list: the job's list changes only when it loses a node."""
        if compact not in self._expanded:
            self._expanded[compact] = self._run(["scontrol", "show", "hostnames", compact]).split()
        return self._expanded[compact]

    def _run(self, argv: list[str]) -> str:
        return self._commands.run(argv, self.timeout, f"{argv[0]} (Slurm job {self.job_id})")


def node_addresses(nodes: Sequence[str], timeout: float) -> dict[str, str]:
    """Each of ``nodes``' address as Slurm has it (``NodeAddr``): how the driver finds
    its route to them without asking DNS for a node name.

    Raises:
        DiscoveryError: ``scontrol`` failed or hung.
    """
    text = run_bounded(
        ["scontrol", "show", "node", "-o", ",".join(nodes)], timeout, "scontrol show node"
    )
    found = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields:
            found[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return found
