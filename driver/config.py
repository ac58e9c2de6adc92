"""The validated ``JobConfig`` of an ``elastic-run`` job, and the rules that resolve it.

``parse_args`` turns argv into settings or raises ``UsageError`` with a one-line message
naming the flag; it does no I/O beyond checking that a discovery script exists and is
executable (a typo there should fail at once, not at the first discovery round). The
flags themselves, their types, defaults and help, are ``driver.flags``; this module
holds what they mean together: the sizes, the hosts, the paths, the job id (each flag's
own check, one at a time: ``driver.config_checks``).

How the worker counts resolve (docs/DESIGN.md contract; our choices where it is silent):

* no hosts (neither ``-H`` nor a script): ``localhost`` with ``-np`` slots; ``-np`` is
  required; ``--max-np`` defaults to ``-np`` (``-np`` alone is a static-size job whose
  failed workers are replaced);
* with hosts: ``-np`` is how many workers to wait for before the first round; it
  defaults to ``--min-np`` if given, else (``-H`` only) to all the slots listed;
  ``--min-np`` defaults to ``-np``; ``--max-np`` defaults to no limit beyond the slots;
* always ``--min-np`` <= ``-np`` <= ``--max-np``; with ``-H`` the slots must hold ``-np``.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

from driver import config_checks as checks
from driver.errors import UsageError
from driver.etcd_security import etcd_environment
from driver.flags import (
    DEFAULT_DRIVER_TIMEOUT,
    DEFAULT_PROGRESS_INTERVAL,
    DEFAULT_PS_CHECKPOINT_INTERVAL,
    DEFAULT_PS_MODE,
    DEFAULT_SLOTS_PER_HOST,
    build_parser,
)
from driver.hosts.discovery import DEFAULT_SCRIPT_TIMEOUT
from driver.hosts.manager import BlacklistPolicy
from driver.hosts.slots import HostSlots
from driver.hosts.slurm import SLURM_JOB_ID
from driver.join.settings import MAKE_SECRET, JoinSettings, default_job_id, join_settings
from rendezvous import env
from rendezvous.errors import RendezvousConfigError
from rendezvous.net.url import StoreURL

# The job id becomes a key segment (/elastic/<job>/...) and part of file names.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}\Z")


@dataclass(frozen=True)
class JobConfig:
    """Validated settings of one ``elastic-run`` job (what each means: the flags'
    help, ``driver.flags.build_parser``)."""

    command: tuple[str, ...]
    np: int  # workers to wait for before the first round
    min_np: int
    max_np: int | None  # None: no limit beyond the slots
    # fixed hosts (-H, or localhost); () with a script; with --join, -H's beside the nodes
    hosts: tuple[HostSlots, ...]
    discovery_script: str | None  # absolute path
    slots_per_host: int
    discovery_interval: float
    rendezvous: StoreURL  # scheme "embedded" (no endpoints) or "etcd" (``tls``: etcds://)
    job_id: str
    network_interface: str | None  # the interface whose address the driver advertises
    driver_address: str | None  # the address the driver advertises (wins over the above)
    reset_limit: int | None  # None: unlimited
    blacklist_cooldown_range: tuple[float, float]
    elastic_timeout: float
    start_timeout: float
    launcher: str  # "auto" | "local" | "ssh" | "slurm" | "ray" (with --ray)
    num_ps: int
    ps_mode: str
    ps_checkpoint_dir: str | None
    ps_checkpoint_interval: float
    chaos_kill_interval: float | None  # None: no chaos
    chaos_max_kills: int | None  # None: unlimited (while chaos is on)
    log_dir: str | None
    events_file: str | None
    verbosity: int
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL  # 0: no progress lines
    spares: int = 0  # warm spare workers kept on each usable host
    standby: bool = False  # wait while another driver leads the job, then take it over
    driver_timeout: float = DEFAULT_DRIVER_TIMEOUT  # agents' wait for a driver (etcd)
    ps_placement: str = "driver"  # "driver" | "spread"
    checkpoint_dir: str | None = None  # snapshots of the workers' state (absolute)
    checkpoint_interval: float = env.DEFAULT_CHECKPOINT_INTERVAL
    on_state_lost: str = "fail"  # "fail" | "restart"
    chaos_below_min_np: bool = False  # the chaos may take the round below --min-np
    ps_replicas: int = 0  # 1: each shard has a backup in step
    join: JoinSettings | None = None  # --join: this node's part of a joined job
    slots_given: bool = False  # --slots-per-host was given (else a scheduler's count)
    allocation: bool = False  # the hosts are the Slurm allocation's (--launcher slurm)
    ray: str | None = None  # --ray ADDRESS: the hosts are that Ray cluster's nodes
    discovery_timeout: float = DEFAULT_SCRIPT_TIMEOUT  # a script's (or squeue's) deadline
    hang_timeout: float | None = None  # --hang-timeout: None adapts, 0 off
    # --restart-workers: whole worlds of workers started with torchrun's variables, every
    # worker restarted when one fails or the hosts change (``driver.policy.restarts``)
    restart_workers: bool = False
    # --job-id was given (or SLURM_JOB_ID under --join); else job_id is a fresh one, and a
    # --checkpoint-dir's own job wins (``driver.checkpoint_folder``)
    job_id_given: bool = False
    # the ELASTIC_ETCD_* variables the --etcd-* flags set, for every process of the job
    # (``driver.etcd_security``; elastic-run puts them in its own environment)
    etcd_env: tuple[tuple[str, str], ...] = ()

    @property
    def uses_discovery(self) -> bool:
        """Whether the hosts come from a source that changes (a script, joined nodes,
        a Slurm allocation, a Ray cluster)."""
        return (
            self.discovery_script is not None
            or self.join is not None
            or self.allocation
            or self.ray is not None
        )

    @property
    def blacklist_policy(self) -> BlacklistPolicy:
        """The host manager's policy: default failure rule, this job's cooldown range."""
        low, high = self.blacklist_cooldown_range
        return BlacklistPolicy(cooldown_min=low, cooldown_max=high)


def _new_job_id() -> str:
    return uuid.uuid4().hex[:12]


def unshared_secret_note(config: JobConfig) -> str | None:
    """What to tell the user of an etcd job with no ``ELASTIC_JOB_SECRET`` (this driver
    makes one up, which no other driver knows), None otherwise."""
    if config.rendezvous.scheme != "etcd" or config.join or env.text(env.ENV_SECRET):
        return None
    return (
        f"no {env.ENV_SECRET}: this driver makes one up, so no other driver (--standby, "
        "or one started after this one dies) can take this job over; to allow it, set the "
        f"same secret for every driver (make one with: {MAKE_SECRET})"
    )


def parse_args(argv: Sequence[str], new_job_id: Callable[[], str] = _new_job_id) -> JobConfig:
    """Parse ``elastic-run``'s arguments (without the program name) into a ``JobConfig``.

    ``new_job_id`` makes the job id when ``--job-id`` is not given.
    Raises ``UsageError`` (one line naming the flag) for bad use; ``--help`` raises
    ``SystemExit(0)`` after printing the help."""
    args = build_parser().parse_args(list(argv))
    try:  # every process of the job inherits them: one line here, not a failure of each
        env.check_tuning()
    except RendezvousConfigError as exc:
        raise UsageError(str(exc)) from None

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError(
            "no COMMAND given: say which program each worker runs, "
            "e.g. elastic-run -np 2 python train.py"
        )

    slots_per_host = (
        args.slots_per_host if args.slots_per_host is not None else DEFAULT_SLOTS_PER_HOST
    )
    fixed_hosts = (
        checks.parse_host_list(args.hosts, slots_per_host) if args.hosts is not None else None
    )
    script = (
        checks.check_script(args.host_discovery_script)
        if args.host_discovery_script is not None
        else None
    )
    if args.ray is not None:
        if fixed_hosts is not None or script is not None or args.join:
            raise UsageError(
                "--ray takes its hosts from the Ray cluster: drop -H, discovery, --join"
            )
        if args.launcher not in ("auto", "ray"):
            raise UsageError(
                f"--ray starts each host's agent through Ray: drop --launcher {args.launcher}"
            )
        args.launcher = "ray"
    elif args.launcher == "ray":
        raise UsageError("--launcher ray needs --ray ADDRESS (the cluster's head, or auto)")
    # --launcher slurm with no other source: the allocation's nodes, found at the start.
    allocation = args.launcher == "slurm" and fixed_hosts is None and script is None
    if args.join and args.launcher == "slurm":
        raise UsageError("--join runs its node's own processes: drop --launcher slurm")
    if args.launcher == "slurm" and not os.environ.get(SLURM_JOB_ID):
        raise UsageError(
            "--launcher slurm runs inside a Slurm allocation (sbatch or salloc): "
            f"{SLURM_JOB_ID} is not set"
        )
    if not args.join and (args.host_name or args.job_secret_file or args.new_job):
        flag = (
            "--host-name"
            if args.host_name
            else "--job-secret-file"
            if args.job_secret_file
            else "--new-job"
        )
        raise UsageError(f"{flag} is for join mode: add --join")
    np, min_np, max_np, hosts = checks.resolve_sizes(
        args.np,
        args.min_np,
        args.max_np,
        None if args.join else fixed_hosts,  # joined nodes bring slots beside -H's
        checks.elastic_source(script is not None, args.join, allocation, args.ray is not None),
    )
    if args.join and fixed_hosts is not None:
        hosts = fixed_hosts  # joined nodes, and these (their agents started by ssh)

    low, high = args.blacklist_cooldown_range
    if low > high:
        raise UsageError(f"--blacklist-cooldown-range: MIN {low:g} is above MAX {high:g}")

    rendezvous = checks.parse_rendezvous(args.rendezvous, args.join)
    etcd_env = etcd_environment(vars(args), rendezvous, os.environ)

    if args.job_id is None:
        args.job_id = default_job_id(args.join)  # under Slurm: its job id
    job_id = args.job_id if args.job_id is not None else new_job_id()
    if not _JOB_ID.match(job_id):
        raise UsageError(
            f"--job-id {job_id!r}: use 1-128 letters, digits, '_', '.', '-' "
            f"(starting with a letter or digit)"
        )

    for flag, value in (
        ("--ps-mode", args.ps_mode),
        ("--ps-checkpoint-dir", args.ps_checkpoint_dir),
        ("--ps-checkpoint-interval", args.ps_checkpoint_interval),
        ("--ps-placement", args.ps_placement),
        ("--ps-replicas", args.ps_replicas),
    ):
        if value is not None and not args.num_ps:
            raise UsageError(
                f"{flag} needs --num-ps N (N >= 1): without shards it would do nothing"
            )

    join = (
        join_settings(
            rendezvous,
            args.job_id,
            args.host_name,
            args.slots_per_host,
            args.job_secret_file,
            new_job=args.new_job,
        )
        if args.join
        else None
    )
    if args.standby and (args.job_id is None or rendezvous.scheme != "etcd"):
        raise UsageError(
            "--standby needs --rendezvous etcd://... and the --job-id of the job to stand "
            "by for (with the embedded store the driver is the store: nothing outlives it)"
        )
    if args.standby and not env.text(env.ENV_SECRET):
        raise UsageError(
            f"--standby needs the job's secret, its leader's: set {env.ENV_SECRET} on "
            f"every driver of the job (make one with: {MAKE_SECRET})"
        )

    if args.chaos_max_kills is not None and args.chaos_kill_interval is None:
        raise UsageError("--chaos-max-kills needs --chaos-kill-interval (chaos is off without it)")
    if args.chaos_below_min_np and args.chaos_kill_interval is None:
        raise UsageError(
            "--chaos-below-min-np needs --chaos-kill-interval (chaos is off without it)"
        )
    if args.restart_workers:
        checks.check_restart_mode(args, command)
        checkpoint_dir, checkpoint_interval = None, env.DEFAULT_CHECKPOINT_INTERVAL
    else:
        checkpoint_dir, checkpoint_interval = checks.snapshot_settings(
            args.checkpoint_dir, args.checkpoint_interval
        )

    return JobConfig(
        command=tuple(command),
        np=np,
        min_np=min_np,
        max_np=max_np,
        hosts=hosts,
        discovery_script=script,
        slots_per_host=slots_per_host,
        slots_given=args.slots_per_host is not None,
        allocation=allocation,
        ray=args.ray,
        discovery_interval=args.discovery_interval,
        discovery_timeout=args.discovery_timeout,
        rendezvous=rendezvous,
        job_id=job_id,
        job_id_given=args.job_id is not None,
        network_interface=args.network_interface,
        driver_address=args.driver_address,
        reset_limit=args.reset_limit,
        blacklist_cooldown_range=(low, high),
        elastic_timeout=args.elastic_timeout,
        start_timeout=args.start_timeout,
        launcher=args.launcher,
        num_ps=args.num_ps,
        ps_mode=args.ps_mode or DEFAULT_PS_MODE,
        ps_checkpoint_dir=checks.check_ps_checkpoint_dir(args.ps_checkpoint_dir),
        ps_checkpoint_interval=args.ps_checkpoint_interval or DEFAULT_PS_CHECKPOINT_INTERVAL,
        chaos_kill_interval=args.chaos_kill_interval,
        chaos_max_kills=args.chaos_max_kills,
        log_dir=args.log_dir,
        events_file=args.events_file,
        verbosity=args.verbosity,
        progress_interval=args.progress_interval,
        hang_timeout=args.hang_timeout,
        spares=args.spares,
        standby=args.standby or args.join,
        driver_timeout=args.driver_timeout,
        ps_placement=args.ps_placement or "driver",
        checkpoint_dir=checkpoint_dir,
        checkpoint_interval=checkpoint_interval,
        on_state_lost=args.on_state_lost,
        chaos_below_min_np=args.chaos_below_min_np,
        ps_replicas=args.ps_replicas or 0,
        join=join,
        restart_workers=args.restart_workers,
        etcd_env=tuple(sorted(etcd_env.items())),
    )
