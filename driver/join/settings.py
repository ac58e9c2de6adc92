"""What join mode needs, checked before anything starts (``JoinSettings``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from driver.errors import UsageError
from driver.hosts.slurm import (
    SLURM_GPUS_ON_NODE,
    SLURM_JOB_ID,
    SLURM_LOCAL_ID,
    SLURM_NODE_ID,
    SLURM_NODE_NAME,
    SLURM_STEP_TASKS_PER_NODE,
    tasks_on_node,
)
from rendezvous import env
from rendezvous.net.url import StoreURL

MAKE_SECRET = "python3 -c 'import secrets; print(secrets.token_hex(32))'"
"""How to make a job secret, said where one is missing."""


def default_job_id(join: bool, environ: Mapping[str, str] | None = None) -> str | None:
    """The job id join mode takes when --job-id is not given: Slurm's job id, if any."""
    if not join:
        return None
    environ = os.environ if environ is None else environ
    return environ.get(SLURM_JOB_ID) or None


def slurm_slots(environ: Mapping[str, str]) -> tuple[int, bool] | None:
    """Slots of this node under Slurm, and whether this task is the one that joins: the
    node's GPUs when Slurm gave it some (one worker each; the step's first task on the
    node joins), else the tasks of this step on the node (``#SBATCH --ntasks-per-node
    N`` and a plain ``srun``: N slots, task 0 joins, the others have nothing to do);
    None outside Slurm."""
    if SLURM_JOB_ID not in environ:
        return None
    first = environ.get(SLURM_LOCAL_ID, "0") == "0"
    gpus = environ.get(SLURM_GPUS_ON_NODE, "")
    if gpus.isdigit() and int(gpus) > 0:
        return int(gpus), first
    node = environ.get(SLURM_NODE_ID, "0")
    tasks = tasks_on_node(
        environ.get(SLURM_STEP_TASKS_PER_NODE, ""), int(node) if node.isdigit() else 0
    )
    return (tasks, first) if tasks else (1, first)


@dataclass(frozen=True)
class JoinSettings:
    """This node's part of a joined job: its ``host`` name (how the job names it) and
    the ``slots`` it offers; the job's ``secret`` (the same on every node).
    ``spare_task``: this process is another Slurm task of a node whose first task joins
    (it has nothing to do). ``serves_port``: the port this node serves the job's store on
    (``--rendezvous embedded://HOST:PORT`` with HOST this node's name)."""

    host: str
    slots: int
    secret: str
    spare_task: bool = False
    serves_port: int | None = None  # embedded://HOST:PORT names this node: it serves the store
    new_job: bool = False  # --new-job: a job of this id that ended is started over

    def __repr__(self) -> str:  # never the secret
        return f"JoinSettings(host={self.host!r}, slots={self.slots})"


def join_settings(
    rendezvous: StoreURL,
    job_id: str | None,
    host_name: str | None,
    slots: int | None,
    secret_file: str | None,
    environ: Mapping[str, str] | None = None,
    *,
    new_job: bool = False,
) -> JoinSettings:
    """The settings of ``--join``, from its flags and the environment (``slots`` None:
    --slots-per-host not given: Slurm's, ``slurm_slots``, else 1).

    Raises:
        UsageError: no etcd store (nor an embedded one a node serves), no ``--job-id``,
            or no secret (each said in one line, with what to do).
    """
    environ = os.environ if environ is None else environ
    if rendezvous.scheme != "etcd" and len(rendezvous.endpoints) != 1:
        raise UsageError(
            "--join needs --rendezvous etcd://HOST:PORT[,...] or etcds://... (a store "
            "that outlives any node), or embedded://HOST:PORT (the node named HOST serves it, and the job "
            "lasts as long as that node)"
        )
    if job_id is None:
        raise UsageError(
            "--join needs --job-id ID (under Slurm: SLURM_JOB_ID): the same on every node"
        )
    from_slurm = slurm_slots(environ) if slots is None else None
    host = host_name or environ.get(SLURM_NODE_NAME) or socket.gethostname()
    served = rendezvous.endpoints[0] if rendezvous.scheme != "etcd" else None
    return JoinSettings(
        host=host,
        serves_port=served.port if served is not None and served.host == host else None,
        slots=slots or (from_slurm[0] if from_slurm else 1),
        secret=_secret(secret_file, environ),
        spare_task=from_slurm is not None and not from_slurm[1],
        new_job=new_job,
    )


def _secret(secret_file: str | None, environ: Mapping[str, str]) -> str:
    if secret_file is not None:
        try:
            with open(secret_file, encoding="utf-8") as f:
                secret = f.read().strip()
        except OSError as exc:
            raise UsageError(
                f"--job-secret-file {secret_file}: cannot read it: {exc.strerror or exc}"
            ) from None
        if not secret:
            raise UsageError(f"--job-secret-file {secret_file}: the file is empty")
        return secret
    secret = environ.get(env.ENV_SECRET, "").strip()
    if not secret:
        raise UsageError(
            f"--join needs the job's secret, the same on every node: set {env.ENV_SECRET} "
            f"or give --job-secret-file PATH (make one with: {MAKE_SECRET})"
        )
    return secret
