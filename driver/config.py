"""The ``elastic-run`` command line: its parser, and the validated ``JobConfig`` it yields.

``parse_args`` turns argv into settings or raises ``UsageError`` with a one-line message
naming the flag; it does no I/O beyond checking that a discovery script exists and is
executable (a typo there should fail at once, not at the first discovery round).

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

import argparse
import math
import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

from driver.errors import HostSpecError, UsageError
from driver.hosts import (
    MAX_SLOTS_PER_HOST,
    MAX_WORKERS,
    BlacklistPolicy,
    HostSlots,
    check_listed_slots,
    parse_host_slots,
    quote_entry,
    total_slots,
)
from driver.launch.launchers import LAUNCHER_NAMES
from rendezvous.private_dir import InsecureDirectoryError, check_private_dir
from rendezvous.url import StoreURL, parse_store_url
from rendezvous.version import package_version

DEFAULT_SLOTS_PER_HOST = 1
DEFAULT_DISCOVERY_INTERVAL = 1.0
DEFAULT_RENDEZVOUS = "embedded"
DEFAULT_BLACKLIST_COOLDOWN_RANGE = (10.0, 300.0)
DEFAULT_ELASTIC_TIMEOUT = 600.0
DEFAULT_START_TIMEOUT = 120.0
DEFAULT_PS_MODE = "async"
DEFAULT_PS_CHECKPOINT_INTERVAL = 60.0
DEFAULT_PROGRESS_INTERVAL = 10.0
PS_MODES = ("async", "sync")

# The job id becomes a key segment (/elastic/<job>/...) and part of file names.
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}\Z")


@dataclass(frozen=True)
class JobConfig:
    """Validated settings of one ``elastic-run`` job (see ``build_parser`` for meanings)."""

    command: tuple[str, ...]
    np: int  # workers to wait for before the first round
    min_np: int
    max_np: int | None  # None: no limit beyond the slots
    hosts: tuple[HostSlots, ...]  # fixed hosts (-H, or localhost); () with a script
    discovery_script: str | None  # absolute path
    slots_per_host: int
    discovery_interval: float
    rendezvous: StoreURL  # scheme "embedded" (no endpoints) or "etcd"
    job_id: str
    network_interface: str | None  # the interface whose address the driver advertises
    driver_address: str | None  # the address the driver advertises (wins over the above)
    reset_limit: int | None  # None: unlimited
    blacklist_cooldown_range: tuple[float, float]
    elastic_timeout: float
    start_timeout: float
    launcher: str  # "auto" | "local" | "ssh"
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

    @property
    def uses_discovery(self) -> bool:
        return self.discovery_script is not None

    @property
    def blacklist_policy(self) -> BlacklistPolicy:
        """The host manager's policy: default failure rule, this job's cooldown range."""
        low, high = self.blacklist_cooldown_range
        return BlacklistPolicy(cooldown_min=low, cooldown_max=high)


# ----------------------------------------------------------------------------- parser


class _RaisingParser(argparse.ArgumentParser):
    """argparse reports errors by printing and exiting; we want a ``UsageError``."""

    def error(self, message: str):
        raise UsageError(message)


def _number_type(
    kind: Callable[[str], float],
    minimum: float,
    strict: bool,
    what: str,
    maximum: tuple[int, str] | None = None,
):
    """An argparse ``type`` converting to ``kind`` and checking the bounds (``maximum``:
    the largest value and why); argparse adds the flag name to the message ("argument
    --x: must be ...")."""

    def convert(text: str):
        digits = text.strip().lstrip("+")
        if (
            maximum is not None
            and digits.isdigit()
            and len(digits.lstrip("0")) > len(str(maximum[0]))
        ):
            # Before converting: a thousand-digit number is too big all the same.
            raise argparse.ArgumentTypeError(
                f"must be at most {maximum[0]} ({maximum[1]}), got {quote_entry(text)}"
            )
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {quote_entry(text)}") from None
        if (
            math.isnan(value)
            or math.isinf(value)
            or value < minimum
            or (strict and value == minimum)
        ):
            raise argparse.ArgumentTypeError(f"must be {what}, got {quote_entry(text)}")
        if maximum is not None and value > maximum[0]:
            raise argparse.ArgumentTypeError(
                f"must be at most {maximum[0]} ({maximum[1]}), got {quote_entry(text)}"
            )
        return value

    convert.__name__ = what  # argparse names the type in some messages
    return convert


_positive_int = _number_type(int, 0, True, "a whole number >= 1")
_worker_count = _number_type(
    int, 0, True, "a whole number >= 1", (MAX_WORKERS, "the most workers one job may have")
)
_slot_count = _number_type(
    int, 0, True, "a whole number >= 1", (MAX_SLOTS_PER_HOST, "the most slots of one host")
)
_non_negative_int = _number_type(int, 0, False, "a whole number >= 0")
_positive_seconds = _number_type(float, 0.0, True, "a number of seconds > 0")
_non_negative_seconds = _number_type(float, 0.0, False, "a number of seconds >= 0")

_DESCRIPTION = """\
Run COMMAND as an elastic, fault-tolerant training job: one worker process per slot,
re-formed into a new round whenever workers fail or hosts come and go."""

_EPILOG = """\
examples:
  elastic-run -np 2 python train.py
      two workers on this machine; a failed worker is replaced
  elastic-run -np 4 -H node1:2,node2:2 python train.py
      four workers on two hosts (ssh to hosts that are not this machine)
  elastic-run --min-np 2 --max-np 16 --host-discovery-script ./discover_hosts.sh \\
      --rendezvous etcd://10.0.0.5:2379,10.0.0.6:2379 python train.py
      grows and shrinks between 2 and 16 workers as the script's host list changes

exit status: 0 when every worker of the final round exited 0; otherwise non-zero with a
one-line reason (bad arguments, reset limit exceeded, elastic timeout, no usable hosts,
a program that cannot start, a job id that a live job holds)."""


def build_parser() -> argparse.ArgumentParser:
    """The ``elastic-run`` argument parser. Its ``error`` raises ``UsageError``;
    ``--help`` prints the help and exits 0 (``SystemExit``), as argparse does."""
    p = _RaisingParser(
        prog="elastic-run",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # "--min" must not silently mean "--min-np"; and abbreviations
        # would make a user's future flag typo land on ours.
        allow_abbrev=False,
    )

    size = p.add_argument_group("job size")
    size.add_argument(
        "-np",
        dest="np",
        type=_worker_count,
        metavar="N",
        help="workers to start with. Without hosts: the job runs N workers on "
        "localhost, replacing any that fail (a static-size job). With hosts: "
        "how many workers must be up before training starts (default: "
        f"--min-np, or all slots of -H; at most {MAX_WORKERS})",
    )
    size.add_argument(
        "--min-np",
        type=_worker_count,
        metavar="N",
        help="fewest workers to train with; below it the job waits for hosts, up "
        "to --elastic-timeout (default: -np)",
    )
    size.add_argument(
        "--max-np",
        type=_worker_count,
        metavar="N",
        help="most workers at once (default: -np without hosts; with hosts no "
        "limit beyond the slots)",
    )

    hosts = p.add_argument_group("hosts")
    where = hosts.add_mutually_exclusive_group()
    where.add_argument(
        "-H",
        "--hosts",
        dest="hosts",
        metavar="HOST[:SLOTS],...",
        help="fixed host list, e.g. node1:4,node2:4; a HOST without :SLOTS gets "
        "--slots-per-host; IPv6 with slots as [addr]:SLOTS (default: localhost "
        "with -np slots)",
    )
    where.add_argument(
        "--host-discovery-script",
        metavar="PATH",
        help="executable run every --discovery-interval; prints one HOST or "
        "HOST:SLOTS per line (blank lines and # comments ignored, a host "
        "listed twice is an error). Hosts it stops listing are removed",
    )
    hosts.add_argument(
        "--slots-per-host",
        type=_slot_count,
        default=DEFAULT_SLOTS_PER_HOST,
        metavar="N",
        help="slots of a host listed without :SLOTS (default: %(default)s)",
    )
    hosts.add_argument(
        "--discovery-interval",
        type=_positive_seconds,
        default=DEFAULT_DISCOVERY_INTERVAL,
        metavar="SEC",
        help="seconds between runs of the discovery script (default: %(default)s)",
    )
    hosts.add_argument(
        "--blacklist-cooldown-range",
        type=_non_negative_seconds,
        nargs=2,
        default=DEFAULT_BLACKLIST_COOLDOWN_RANGE,
        metavar=("MIN", "MAX"),
        help="a host whose workers keep failing is left out for a cooldown that "
        "starts at MIN seconds and doubles with each blacklisting up to MAX "
        f"(default: {DEFAULT_BLACKLIST_COOLDOWN_RANGE[0]:g} "
        f"{DEFAULT_BLACKLIST_COOLDOWN_RANGE[1]:g}). A host is left out when "
        f"{BlacklistPolicy.failure_threshold} of its workers fail within "
        f"{BlacklistPolicy.failure_window:g} s, but never if that would leave "
        f"fewer than --min-np slots",
    )

    store = p.add_argument_group("rendezvous")
    store.add_argument(
        "--rendezvous",
        default=DEFAULT_RENDEZVOUS,
        metavar="URL",
        help="'embedded' (the driver runs the store) or "
        "etcd://HOST:PORT[,HOST:PORT...] (default: %(default)s)",
    )
    store.add_argument(
        "--job-id",
        metavar="ID",
        help="names the job's keys in the store; letters, digits, '_', '.', '-'; "
        "an id a live job holds is refused (default: a fresh random id)",
    )

    store.add_argument(
        "--network-interface",
        metavar="NAME",
        help="advertise this interface's address to the other hosts (default: the "
        "address of the route toward the hosts; loopback for a one-machine job)",
    )
    store.add_argument(
        "--driver-address",
        metavar="ADDR",
        help="advertise ADDR to the other hosts for the driver's servers (the embedded "
        "store); wins over --network-interface",
    )

    fault = p.add_argument_group("fault tolerance")
    fault.add_argument(
        "--reset-limit",
        type=_non_negative_int,
        metavar="N",
        help="fail the job when more than N rounds follow the first (each worker "
        "failure or host change makes a new round) (default: unlimited)",
    )
    fault.add_argument(
        "--elastic-timeout",
        type=_positive_seconds,
        default=DEFAULT_ELASTIC_TIMEOUT,
        metavar="SEC",
        help="fail the job after waiting this long for --min-np "
        "workers once training started (default: %(default)s)",
    )
    fault.add_argument(
        "--start-timeout",
        type=_positive_seconds,
        default=DEFAULT_START_TIMEOUT,
        metavar="SEC",
        help="fail the job if -np workers have not registered this "
        "long after start (default: %(default)s)",
    )
    fault.add_argument(
        "--launcher",
        choices=LAUNCHER_NAMES,
        default="auto",
        help="how workers start: 'local' runs every worker on this machine "
        "whatever its host name (handy to simulate hosts: the names are labels that "
        "need not resolve, and every process talks over loopback), 'ssh' runs "
        "'ssh HOST' for every host, 'auto' uses local for this machine and "
        "ssh for the others (default: %(default)s)",
    )

    ps = p.add_argument_group("parameter servers")
    ps.add_argument(
        "--num-ps",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="parameter-server shards to run (default: %(default)s, none)",
    )
    # The three below default to None so that giving one without --num-ps is an error
    # (it would do nothing); parse_args fills in the defaults the help names.
    ps.add_argument(
        "--ps-mode",
        choices=PS_MODES,
        help="async: apply each push on arrival; sync: apply step s once every "
        f"worker of the round pushed it; needs --num-ps (default: {DEFAULT_PS_MODE})",
    )
    ps.add_argument(
        "--ps-checkpoint-dir",
        metavar="DIR",
        help="where shards write checkpoints and restart from; needs --num-ps "
        "(default: none, so a restarted shard starts empty)",
    )
    ps.add_argument(
        "--ps-checkpoint-interval",
        type=_positive_seconds,
        metavar="SEC",
        help="seconds between checkpoints; needs --num-ps, and is ignored without "
        f"--ps-checkpoint-dir (default: {DEFAULT_PS_CHECKPOINT_INTERVAL:g})",
    )

    chaos = p.add_argument_group("chaos testing")
    chaos.add_argument(
        "--chaos-kill-interval",
        type=_positive_seconds,
        metavar="SEC",
        help="SIGKILL a random worker every SEC seconds (default: off)",
    )
    chaos.add_argument(
        "--chaos-max-kills",
        type=_non_negative_int,
        metavar="N",
        help="stop the chaos after N kills; needs --chaos-kill-interval (default: unlimited)",
    )

    out = p.add_argument_group("output")
    out.add_argument(
        "--log-dir",
        metavar="DIR",
        help="also write each worker's output to a file in DIR (default: none)",
    )
    out.add_argument(
        "--events",
        dest="events_file",
        metavar="FILE",
        help="append one JSON line per event (rounds, worker and host changes, "
        "progress) to FILE; each run's lines begin with its job_started "
        "(default: none)",
    )
    out.add_argument(
        "--progress-interval",
        type=_non_negative_seconds,
        default=DEFAULT_PROGRESS_INTERVAL,
        metavar="SEC",
        help="every SEC seconds, a line (and a 'progress' event) with the round, its "
        "world size, the committed steps and steps/s, for workers that commit a "
        "State; rank 0 writes its step to the store as often; 0 turns it off "
        "(default: %(default)g)",
    )
    out.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {package_version()}",
        help="print the version and exit",
    )
    out.add_argument(
        "-v",
        "--verbose",
        dest="verbosity",
        action="count",
        default=0,
        help="more driver output on stderr; repeat for more",
    )

    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="COMMAND [ARG...]",
        help="the worker program and its arguments; everything from COMMAND on "
        "belongs to it (put -- before it if it starts with '-')",
    )
    return p


def _new_job_id() -> str:
    return uuid.uuid4().hex[:12]


def _parse_host_list(text: str, default_slots: int) -> tuple[HostSlots, ...]:
    hosts: list[HostSlots] = []
    for entry in text.split(","):
        try:
            host = parse_host_slots(entry, default_slots)
        except HostSpecError as e:
            raise UsageError(f"-H: {e}") from None
        if any(h.host == host.host for h in hosts):
            raise UsageError(f"-H: host {host.host!r} listed twice")
        hosts.append(host)
    try:
        check_listed_slots(hosts, "-H")
    except HostSpecError as e:
        raise UsageError(str(e)) from None
    return tuple(hosts)


def _parse_rendezvous(text: str) -> StoreURL:
    try:
        url = parse_store_url(text)
    except ValueError as e:  # RendezvousConfigError is a ValueError; so is a stray int() error
        raise UsageError(f"--rendezvous: {e}") from None
    if url.scheme == DEFAULT_RENDEZVOUS and url.endpoints:
        # embedded://HOST:PORT is how workers reach the store the driver runs; the
        # driver picks that address itself, so a user-given one would be ignored.
        raise UsageError(
            f"--rendezvous {text}: use 'embedded' (the driver chooses the "
            f"embedded store's address) or etcd://HOST:PORT[,HOST:PORT...]"
        )
    return url


def _check_script(path: str) -> str:
    if not os.path.exists(path):
        raise UsageError(f"--host-discovery-script {path}: no such file")
    if not os.path.isfile(path):
        raise UsageError(f"--host-discovery-script {path}: not a file")
    if not os.access(path, os.X_OK):
        raise UsageError(f"--host-discovery-script {path}: not executable (chmod +x it)")
    return os.path.abspath(path)


def _check_checkpoint_dir(path: str | None) -> str | None:
    """An existing checkpoint root must be the job user's own (the shards create a
    missing one, and check it again: ``rendezvous.private_dir``)."""
    if path and os.path.lexists(path):
        try:
            check_private_dir(path, "--ps-checkpoint-dir")
        except InsecureDirectoryError as e:
            raise UsageError(str(e)) from None
    return path


def _resolve_sizes(
    np: int | None,
    min_np: int | None,
    max_np: int | None,
    fixed_hosts: tuple[HostSlots, ...] | None,
    has_script: bool,
) -> tuple[int, int, int | None, tuple[HostSlots, ...]]:
    """(np, min_np, max_np, fixed hosts) after defaults; see the module docstring."""
    if np is not None and min_np is not None and min_np > np:
        raise UsageError(f"-np {np} is below --min-np {min_np}")
    if fixed_hosts is None and not has_script:
        if np is None:
            raise UsageError("-np is required when neither -H nor --host-discovery-script is given")
        if np > MAX_SLOTS_PER_HOST:
            raise UsageError(
                f"-np {np}: without -H every worker runs on localhost, which may have at "
                f"most {MAX_SLOTS_PER_HOST} slots; list the hosts with -H"
            )
        fixed_hosts = (HostSlots("localhost", np),)
        if max_np is None:
            max_np = np
    if np is None:
        if min_np is not None:
            np = min_np
        elif fixed_hosts is not None:
            np = total_slots(fixed_hosts)
        else:
            raise UsageError("--host-discovery-script needs -np or --min-np")
    if min_np is None:
        min_np = np
    if max_np is not None and min_np > max_np:
        raise UsageError(f"--min-np {min_np} is above --max-np {max_np}")
    if max_np is not None and np > max_np:
        raise UsageError(f"-np {np} is above --max-np {max_np}")
    if fixed_hosts is not None and total_slots(fixed_hosts) < np:
        raise UsageError(f"-H has {total_slots(fixed_hosts)} slot(s) in all, fewer than -np {np}")
    return np, min_np, max_np, fixed_hosts or ()


def parse_args(argv: Sequence[str], new_job_id: Callable[[], str] = _new_job_id) -> JobConfig:
    """Parse ``elastic-run``'s arguments (without the program name) into a ``JobConfig``.

    ``new_job_id`` makes the job id when ``--job-id`` is not given.
    Raises ``UsageError`` (one line naming the flag) for bad use; ``--help`` raises
    ``SystemExit(0)`` after printing the help."""
    args = build_parser().parse_args(list(argv))

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError(
            "no COMMAND given: say which program each worker runs, "
            "e.g. elastic-run -np 2 python train.py"
        )

    fixed_hosts = (
        _parse_host_list(args.hosts, args.slots_per_host) if args.hosts is not None else None
    )
    script = (
        _check_script(args.host_discovery_script)
        if args.host_discovery_script is not None
        else None
    )
    np, min_np, max_np, hosts = _resolve_sizes(
        args.np, args.min_np, args.max_np, fixed_hosts, script is not None
    )

    low, high = args.blacklist_cooldown_range
    if low > high:
        raise UsageError(f"--blacklist-cooldown-range: MIN {low:g} is above MAX {high:g}")

    rendezvous = _parse_rendezvous(args.rendezvous)

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
    ):
        if value is not None and not args.num_ps:
            raise UsageError(
                f"{flag} needs --num-ps N (N >= 1): without shards it would do nothing"
            )

    if args.chaos_max_kills is not None and args.chaos_kill_interval is None:
        raise UsageError("--chaos-max-kills needs --chaos-kill-interval (chaos is off without it)")

    return JobConfig(
        command=tuple(command),
        np=np,
        min_np=min_np,
        max_np=max_np,
        hosts=hosts,
        discovery_script=script,
        slots_per_host=args.slots_per_host,
        discovery_interval=args.discovery_interval,
        rendezvous=rendezvous,
        job_id=job_id,
        network_interface=args.network_interface,
        driver_address=args.driver_address,
        reset_limit=args.reset_limit,
        blacklist_cooldown_range=(low, high),
        elastic_timeout=args.elastic_timeout,
        start_timeout=args.start_timeout,
        launcher=args.launcher,
        num_ps=args.num_ps,
        ps_mode=args.ps_mode or DEFAULT_PS_MODE,
        ps_checkpoint_dir=_check_checkpoint_dir(args.ps_checkpoint_dir),
        ps_checkpoint_interval=args.ps_checkpoint_interval or DEFAULT_PS_CHECKPOINT_INTERVAL,
        chaos_kill_interval=args.chaos_kill_interval,
        chaos_max_kills=args.chaos_max_kills,
        log_dir=args.log_dir,
        events_file=args.events_file,
        verbosity=args.verbosity,
        progress_interval=args.progress_interval,
    )
