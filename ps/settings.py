"""Settings of the ps client and shards (frozen: shared freely between threads)."""

from __future__ import annotations

from dataclasses import dataclass

from ps.errors import PSConfigError
from rendezvous.errors import RendezvousConfigError
from rendezvous.net.url import Endpoint

MODES = ("async", "sync")
MiB = 1 << 20
# Variables above this many bytes are split on axis 0 across shards (see partition.py).
DEFAULT_SPLIT_THRESHOLD = 1 * MiB


@dataclass(frozen=True)
class ClientSettings:
    """How a ``PSClient`` talks to shards.

    ``retry_deadline`` bounds how long one operation keeps retrying a shard that is down
    or restoring; past it ``PSUnavailableError`` is raised. ``call_timeout`` bounds one
    attempt of one RPC. Payloads above ``chunk_bytes`` move in pieces of that size over
    the shards' bulk TCP ports (``ps.bulk``), up to ``lanes`` connections per
    shard at once, because a few concurrent streams move bytes faster than one (see
    benchmarks/ps_bench.py)."""

    retry_deadline: float = 60.0
    call_timeout: float = 30.0
    sync_timeout: float = 600.0  # a sync step waits this long for slow members
    poll_interval: float = 0.5  # long-poll slice while a sync step waits
    backoff_initial: float = 0.02
    backoff_max: float = 0.5
    chunk_bytes: int = 4 * MiB
    lanes: int = 4
    connect_timeout: float = 10.0  # connect(): wait for the shards' addresses
    tune_malloc: bool = True  # see ps/memory.py (process-wide, glibc only)

    def __post_init__(self):
        for name in (
            "retry_deadline",
            "call_timeout",
            "sync_timeout",
            "poll_interval",
            "backoff_initial",
            "backoff_max",
            "connect_timeout",
        ):
            if getattr(self, name) <= 0:
                raise PSConfigError(f"ClientSettings.{name} must be > 0")
        if self.chunk_bytes < 1024 or self.lanes < 1:
            raise PSConfigError("ClientSettings.chunk_bytes must be >= 1024 and lanes >= 1")


@dataclass(frozen=True)
class BulkLimits:
    """What a shard's bulk port holds whatever its clients do (``ps.shard.bulk``).

    ``max_connections``: authenticated connections served at once (a thread each; a
    client uses up to ``ClientSettings.lanes`` per shard). ``max_handshakes``:
    connections still proving the job secret; a new one beyond that pushes out the
    oldest (honest clients prove it within a round trip, so the oldest is the likeliest
    stranger). ``handshake_timeout``: seconds a new connection has to prove the secret.
    ``fd_reserve``: when the process runs out of file descriptors, unproven connections
    are closed until this many are free again for the rest of the shard (gRPC, the
    store, checkpoint files). ``backoff_max``: the longest pause of the accept loop
    while the process is out of file descriptors."""

    max_connections: int = 512
    max_handshakes: int = 64
    handshake_timeout: float = 5.0
    fd_reserve: int = 32
    backoff_max: float = 1.0

    def __post_init__(self):
        if self.max_connections < 1 or self.max_handshakes < 1 or self.fd_reserve < 0:
            raise PSConfigError(
                "BulkLimits needs max_connections and max_handshakes >= 1, fd_reserve >= 0"
            )
        if not (self.handshake_timeout > 0 and self.backoff_max > 0):
            raise PSConfigError("BulkLimits needs handshake_timeout and backoff_max > 0")


@dataclass(frozen=True)
class ServerSettings:
    """One shard's configuration (the command line of ``python -m ps.server``).

    Raises:
        PSConfigError: a bad index, mode, bind address, interval or threshold."""

    index: int
    num_shards: int
    mode: str = "async"
    bind: str = "127.0.0.1:0"
    checkpoint_dir: str | None = None
    checkpoint_interval: float = 30.0
    keep_checkpoints: int = 3
    split_threshold: int = DEFAULT_SPLIT_THRESHOLD
    pause_timeout: float = 10.0  # a checkpoint pause ends by itself after this (coordinator died)
    align_timeout: float = 2.0  # how long shards may take to reach the checkpoint's step
    peer_deadline: float = 60.0  # restore/rollback keeps trying an unreachable peer this long
    peer_call_timeout: float = 120.0  # one control call (a snapshot includes writing the file)
    max_wait: float = 2.0  # cap on one long-poll inside the shard
    staging_ttl: float = 300.0  # an abandoned upload/download is dropped after this
    stop_timeout: float = 20.0  # a stopping shard tries this long to checkpoint the state
    bulk: BulkLimits = BulkLimits()  # what the bulk port holds whatever clients do
    replicas: int = 0  # 1: every update is mirrored to a backup before it is acknowledged
    backup: bool = False  # this process starts as the backup of shard ``index``
    mirror_patience: float = 1.0  # a primary retries an unreachable backup this long
    mirror_timeout: float = 10.0  # bound on one mirror call (its payload is a push's size)

    def __post_init__(self):
        if self.num_shards < 1 or not 0 <= self.index < self.num_shards:
            raise PSConfigError(f"shard index {self.index} is not in 0..{self.num_shards - 1}")
        if self.mode not in MODES:
            raise PSConfigError(f"ps mode must be one of {MODES}, not {self.mode!r}")
        if self.checkpoint_interval <= 0 or self.keep_checkpoints < 1:
            raise PSConfigError("checkpoint interval must be > 0 and keep_checkpoints >= 1")
        if not self.stop_timeout > 0:
            raise PSConfigError("the stop timeout must be > 0 seconds")
        if self.split_threshold < 1:
            raise PSConfigError("split_threshold must be >= 1 byte")
        if self.replicas not in (0, 1) or (self.backup and not self.replicas):
            raise PSConfigError(
                f"replicas must be 0 or 1 (not {self.replicas}), and 1 for a backup"
            )
        if not (self.mirror_patience > 0 and self.mirror_timeout > 0):
            raise PSConfigError("the mirror patience and timeout must be > 0 seconds")
        _bind_endpoint(self.bind)  # a bad address fails here, at start-up

    def checkpoint_root(self) -> str:
        """The checkpoint directory.

        Raises:
            PSConfigError: the shard was started without ``--checkpoint-dir``."""
        if not self.checkpoint_dir:
            raise PSConfigError(f"ps shard {self.index} has no checkpoint directory")
        return self.checkpoint_dir

    @property
    def bind_endpoint(self) -> Endpoint:
        """Where the shard serves (port 0: any free port); its bulk port binds the same host."""
        return _bind_endpoint(self.bind)


def _bind_endpoint(bind: str) -> Endpoint:
    """Raises PSConfigError when ``bind`` is not HOST:PORT."""
    try:
        return Endpoint.parse(bind, "the shard's --bind", allow_port_zero=True)
    except RendezvousConfigError as exc:
        raise PSConfigError(str(exc)) from None
