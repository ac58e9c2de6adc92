"""What join mode needs, checked before anything starts (``JoinSettings``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from driver.errors import UsageError
from rendezvous import env
from rendezvous.net.url import StoreURL

MAKE_SECRET = "python3 -c 'import secrets; print(secrets.token_hex(32))'"
"""How to make a job secret, said where one is missing."""


SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_NODE_NAME = "SLURMD_NODENAME"
"""Slurm's names for a task's job and node: join mode's defaults for --job-id and
--host-name (``srun elastic-run --join ...`` needs neither)."""


def default_job_id(join: bool, environ: Mapping[str, str] | None = None) -> str | None:
    """The job id join mode takes when --job-id is not given: Slurm's job id, if any."""
    if not join:
        return None
    environ = os.environ if environ is None else environ
    return environ.get(SLURM_JOB_ID) or None


@dataclass(frozen=True)
class JoinSettings:
    """This node's part of a joined job: its ``host`` name (how the job names it) and
    the ``slots`` it offers; the job's ``secret`` (the same on every node)."""

    host: str
    slots: int
    secret: str

    def __repr__(self) -> str:  # never the secret
        return f"JoinSettings(host={self.host!r}, slots={self.slots})"


def join_settings(
    rendezvous: StoreURL,
    job_id: str | None,
    host_name: str | None,
    slots: int,
    secret_file: str | None,
    environ: Mapping[str, str] | None = None,
) -> JoinSettings:
    """The settings of ``--join``, from its flags and the environment.

    Raises:
        UsageError: no etcd store, no ``--job-id``, or no secret (each said in one line,
            with what to do).
    """
    environ = os.environ if environ is None else environ
    if rendezvous.scheme != "etcd":
        raise UsageError(
            "--join needs --rendezvous etcd://HOST:PORT[,...]: every node must reach one "
            "store that outlives any of them"
        )
    if job_id is None:
        raise UsageError(
            "--join needs --job-id ID (under Slurm: SLURM_JOB_ID): the same on every node"
        )
    return JoinSettings(
        host=host_name or environ.get(SLURM_NODE_NAME) or socket.gethostname(),
        slots=slots,
        secret=_secret(secret_file, environ),
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
