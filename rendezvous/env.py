"""Every ``ELASTIC_*`` environment variable of the project, and the typed readers.

The driver tells workers and shards about their job through the environment; users
tune a few things the same way. Each name is defined here once; code elsewhere reads a
variable through ``text``/``number``/``integer``/``flag`` below, which name the variable
in the error when its value does not parse (the single typed gate for untyped input).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from rendezvous.errors import RendezvousConfigError

# -- set by elastic-run for every process of the job (worker or ps shard)
ENV_RENDEZVOUS = "ELASTIC_RENDEZVOUS"  # store URL: embedded address or etcd://...
ENV_JOB_ID = "ELASTIC_JOB_ID"
ENV_SECRET = "ELASTIC_JOB_SECRET"  # the per-job secret (never on a command line)

# -- set by elastic-run for each worker
ENV_WORKER_ID = "ELASTIC_WORKER_ID"  # unique per launched worker process
ENV_HOST = "ELASTIC_HOST"  # the host name the driver knows this worker by
ENV_SLOT = "ELASTIC_SLOT"
ENV_BIND_HOST = "ELASTIC_BIND_HOST"  # address the worker's data listener binds to
ENV_ROUND_TIMEOUT = "ELASTIC_ROUND_TIMEOUT"  # seconds a worker waits for a round with it
ENV_PROGRESS_INTERVAL = "ELASTIC_PROGRESS_INTERVAL"  # seconds between progress records (0: none)
ENV_HANG_TIMEOUT = "ELASTIC_HANG_TIMEOUT"  # --hang-timeout: seconds, 0 off, "" adapt
ENV_SPARE = "ELASTIC_SPARE"  # "1": a warm spare (--spares), idle until a round includes it
ENV_WORLD = "ELASTIC_WORLD"  # --restart-workers: the number of the world the worker starts in

#: ``--hang-timeout``'s adaptive default (``elastic.hangs.clock.hang_timeout``): a worker
#: whose training goes this many times its median step without a collective is hung,
#: but never sooner than ``HANG_FLOOR`` seconds (a first step's compile or data load, a
#: slow loaded machine)
HANG_FACTOR = 5.0
HANG_FLOOR = 60.0

# -- set by a host's agent for each process it starts (``rendezvous.host_channel``)
ENV_AGENT_SOCKET = "ELASTIC_AGENT_SOCKET"  # the agent's socket: workers register through it

# -- set by elastic-run --restart-workers for each worker, under the names torchrun gives
#    them (``torch.distributed.init_process_group`` reads RANK, WORLD_SIZE, MASTER_*)
TORCH_RANK = "RANK"
TORCH_LOCAL_RANK = "LOCAL_RANK"
TORCH_WORLD_SIZE = "WORLD_SIZE"
TORCH_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
TORCH_GROUP_RANK = "GROUP_RANK"  # the index of the worker's host among the world's hosts
TORCH_GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"  # how many hosts the world spans
TORCH_ROLE_NAME = "ROLE_NAME"
TORCH_ROLE_RANK = "ROLE_RANK"
TORCH_ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
TORCH_MASTER_ADDR = "MASTER_ADDR"  # rank 0's address, where it serves the c10d store
TORCH_MASTER_PORT = "MASTER_PORT"  # a free port on rank 0's host, fresh for each world
TORCH_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
TORCH_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
TORCH_RUN_ID = "TORCHELASTIC_RUN_ID"
TORCH_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"  # "False": rank 0 serves the store
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"  # the interface gloo binds (its own variable)
OMP_NUM_THREADS = "OMP_NUM_THREADS"

# -- durable snapshots of the workers' state (--checkpoint-dir): elastic-run passes its
#    flags on to every worker through these; a user may set them instead of the flags, and
#    a script run alone (no elastic-run) takes them too
ENV_CHECKPOINT_DIR = "ELASTIC_CHECKPOINT_DIR"  # where snapshots go ("" or unset: none)
ENV_CHECKPOINT_INTERVAL = "ELASTIC_CHECKPOINT_INTERVAL"  # seconds between two snapshots
#: seconds between two snapshots when neither ``--checkpoint-interval`` nor
#: ``ELASTIC_CHECKPOINT_INTERVAL`` says: at most this much training is lost when every
#: worker is (the driver's default for the flag and a worker's when run alone)
DEFAULT_CHECKPOINT_INTERVAL = 30.0

# -- tuning a user may set (inherited by every process of the job)
ENV_LEASE_TTL = "ELASTIC_LEASE_TTL"  # seconds of a worker registration's lease
ENV_PEER_TIMEOUT = "ELASTIC_PEER_TIMEOUT"  # seconds before a silent ring peer is lost
ENV_CONNECT_TIMEOUT = "ELASTIC_CONNECT_TIMEOUT"  # seconds to connect to ring neighbours
ENV_SSH_OPTIONS = "ELASTIC_SSH_OPTIONS"  # extra ssh arguments (shell words) for the driver
ENV_TORCH_BACKEND = "ELASTIC_TORCH_BACKEND"  # elastic.torch's data plane: auto, ring, gloo, nccl

# -- etcd's own security, passed through to every client of the job
ENV_ETCD_USER = "ELASTIC_ETCD_USER"
ENV_ETCD_PASSWORD = "ELASTIC_ETCD_PASSWORD"
ENV_ETCD_CA_CERT = "ELASTIC_ETCD_CA_CERT"
ENV_ETCD_CERT = "ELASTIC_ETCD_CERT"
ENV_ETCD_KEY = "ELASTIC_ETCD_KEY"


@dataclass(frozen=True)
class Tuning:
    """The range a user-tunable variable must lie in (both ends included), and its unit:
    a value outside makes no sense (a ring timeout of 1e-9 s hangs the job, one of 0
    cannot be met), so it is refused in one line before anything starts."""

    low: float
    high: float
    unit: str = "seconds"
    whole: bool = False  # an integer

    def describe(self) -> str:
        return f"{self.unit} from {self.low:g} to {self.high:g}"


TUNING: dict[str, Tuning] = {
    ENV_PEER_TIMEOUT: Tuning(0.5, 86400.0),
    ENV_CONNECT_TIMEOUT: Tuning(0.5, 86400.0),
    ENV_LEASE_TTL: Tuning(1, 3600, "whole seconds", whole=True),
}
"""The variables a user tunes by hand, with their ranges: checked by ``tuned`` where a
process reads one, and all at once by ``check_tuning`` (``elastic-run`` at its start, so
a bad value is one line there, not a failure of every worker)."""


def tuned(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """The value of tunable ``name`` (one of ``TUNING``), ``default`` when unset.

    Raises:
        RendezvousConfigError: it does not parse or lies outside its range (one line
            naming the variable, its value and the range).
    """
    raw = text(name, None, environ)
    if raw is None:
        return default
    bounds = TUNING[name]
    try:
        value = int(raw) if bounds.whole else float(raw)
    except ValueError:
        value = None
    if value is None or not bounds.low <= value <= bounds.high:  # (nan compares false)
        what = "is not a number" if value is None else "is out of range"
        raise RendezvousConfigError(f"{name}={raw!r} {what}: use {bounds.describe()}")
    return value


def check_tuning(environ: Mapping[str, str] | None = None) -> None:
    """Every variable of ``TUNING`` that is set, checked (``tuned``).

    Raises:
        RendezvousConfigError: the first one that is not valid.
    """
    for name in TUNING:
        tuned(name, 0.0, environ)


def text(
    name: str, default: str | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The variable's value; ``default`` when it is unset or empty."""
    value = (os.environ if environ is None else environ).get(name)
    return value if value else default


def number(
    name: str, default: float, environ: Mapping[str, str] | None = None, *, positive: bool = True
) -> float:
    """The variable as a float (``default`` when unset). Raises RendezvousConfigError
    naming the variable when the value is not a (positive, if asked) finite number."""
    raw = text(name, None, environ)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise RendezvousConfigError(f"{name}={raw!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")) or (positive and value <= 0):
        raise RendezvousConfigError(
            f"{name}={raw!r} must be a {'positive ' if positive else ''}finite number"
        )
    return value


def integer(
    name: str, default: int, environ: Mapping[str, str] | None = None, *, minimum: int | None = None
) -> int:
    """The variable as an int (``default`` when unset). Raises RendezvousConfigError
    naming the variable when the value is not a whole number (at least ``minimum``)."""
    raw = text(name, None, environ)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise RendezvousConfigError(f"{name}={raw!r} is not a whole number") from None
    if minimum is not None and value < minimum:
        raise RendezvousConfigError(f"{name}={raw!r} must be at least {minimum}")
    return value


def flag(name: str, default: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """The variable as a yes/no switch (1/0, true/false, yes/no, on/off). Raises
    RendezvousConfigError naming the variable for any other value."""
    raw = text(name, None, environ)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise RendezvousConfigError(f"{name}={raw!r} is not a yes/no value (use 1 or 0)")
