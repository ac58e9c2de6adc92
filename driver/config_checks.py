"""The checks of ``elastic-run``'s flags one by one (``driver.config.parse_args`` puts
them together into a ``JobConfig``): each takes the values of a flag or two and returns
them resolved, or raises ``UsageError`` with a one-line message naming the flag.

Why apart from ``driver.config``: those are the rules a user meets one at a time (the
sizes, the hosts, the store, the paths, restart mode); ``parse_args`` is the order they
are met in. The only I/O is on the paths: a discovery script must exist and be
executable, an existing ``--ps-checkpoint-dir`` must be private, and ``--checkpoint-dir``
is made (private) and probed writable, so a typo fails at once, not at the first round.
How the worker counts resolve is in ``driver.config``'s docstring (``resolve_sizes``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from driver.errors import HostSpecError, UsageError
from driver.flags import DEFAULT_RENDEZVOUS
from driver.hosts.slots import (
    MAX_SLOTS_PER_HOST,
    HostSlots,
    check_listed_slots,
    parse_host_slots,
    total_slots,
)
from driver.programs.python_command import python_program
from rendezvous import env
from rendezvous.errors import RendezvousConfigError
from rendezvous.net.url import StoreURL, parse_store_url
from rendezvous.private_dir import (
    InsecureDirectoryError,
    UnwritableDirectoryError,
    check_private_dir,
    probe_writable,
)


def parse_host_list(text: str, default_slots: int) -> tuple[HostSlots, ...]:
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


def parse_rendezvous(text: str, join: bool = False) -> StoreURL:
    try:
        url = parse_store_url(text)
    except ValueError as e:  # RendezvousConfigError is a ValueError; so is a stray int() error
        raise UsageError(f"--rendezvous: {e}") from None
    if url.scheme == DEFAULT_RENDEZVOUS and url.endpoints and not join:
        # embedded://HOST:PORT is how workers reach the store the driver runs; the
        # driver picks that address itself, so a user-given one would be ignored.
        raise UsageError(
            f"--rendezvous {text}: use 'embedded' (the driver chooses the "
            f"embedded store's address), etcd://HOST:PORT[,HOST:PORT...] or etcds://..."
        )
    return url


def check_script(path: str) -> str:
    if not os.path.exists(path):
        raise UsageError(f"--host-discovery-script {path}: no such file")
    if not os.path.isfile(path):
        raise UsageError(f"--host-discovery-script {path}: not a file")
    if not os.access(path, os.X_OK):
        raise UsageError(f"--host-discovery-script {path}: not executable (chmod +x it)")
    return os.path.abspath(path)


def check_ps_checkpoint_dir(path: str | None) -> str | None:
    """An existing ``--ps-checkpoint-dir`` must be the job user's own (the shards create
    a missing one, and check it again: ``rendezvous.private_dir``). The workers'
    ``--checkpoint-dir``, where snapshots go, is ``snapshot_settings``'s."""
    if path and os.path.lexists(path):
        try:
            check_private_dir(path, "--ps-checkpoint-dir")
        except InsecureDirectoryError as e:
            raise UsageError(str(e)) from None
    return path


def snapshot_settings(directory: str | None, interval: float | None) -> tuple[str | None, float]:
    """``--checkpoint-dir`` and ``--checkpoint-interval``, each from its environment
    variable when not given (a scheduler's script may set those instead); the directory
    absolute, made when missing (private), and refused when others may write in it.

    Raises:
        UsageError: an interval without a directory, a bad value, or a directory that is
            not private or cannot be made (the message names the flag).
    """
    try:
        interval_env = env.number(env.ENV_CHECKPOINT_INTERVAL, env.DEFAULT_CHECKPOINT_INTERVAL)
    except RendezvousConfigError as exc:
        raise UsageError(str(exc)) from None
    directory = directory or env.text(env.ENV_CHECKPOINT_DIR)
    if not directory:
        if interval is not None:
            raise UsageError(
                "--checkpoint-interval needs --checkpoint-dir (no snapshots without it)"
            )
        return None, env.DEFAULT_CHECKPOINT_INTERVAL
    directory = os.path.abspath(directory)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        check_private_dir(directory, "--checkpoint-dir")
        probe_writable(directory, "--checkpoint-dir")
    except (InsecureDirectoryError, UnwritableDirectoryError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(
            f"--checkpoint-dir {directory}: cannot make it: {exc.strerror or exc}"
        ) from None
    return directory, interval if interval is not None else interval_env


def check_restart_mode(args, command: Sequence[str]) -> None:
    """``--restart-workers`` runs programs that never call ``elastic.init()``: what only
    such workers can do is refused, in one line naming the flag. Its spares import a
    Python program ahead of need: they need a command that is one.

    Raises:
        UsageError: a flag restart mode cannot honour.
    """
    refused = (
        (
            "--spares",
            args.spares and python_program(command) is None,
            "a spare imports a Python program ahead of need: the command must be "
            "'python SCRIPT [ARG...]' or 'python -m MODULE [ARG...]'",
        ),
        ("--num-ps", args.num_ps, "the ps shards serve elastic.ps clients"),
        (
            "--checkpoint-dir",
            args.checkpoint_dir or args.checkpoint_interval,
            "the script's own checkpoints carry the training across restarts",
        ),
        (
            "--on-state-lost restart",
            args.on_state_lost == "restart",
            "every restart starts the script again, which resumes from its own checkpoints",
        ),
    )
    for flag, given, why in refused:
        if given:
            raise UsageError(f"{flag} does not go with --restart-workers: {why}")


def resolve_sizes(
    np: int | None,
    min_np: int | None,
    max_np: int | None,
    fixed_hosts: tuple[HostSlots, ...] | None,
    elastic_source: str,
) -> tuple[int, int, int | None, tuple[HostSlots, ...]]:
    """(np, min_np, max_np, fixed hosts) after defaults; see ``driver.config``'s docstring.
    ``elastic_source``: the flag of a source of hosts that changes ("" for none)."""
    if np is not None and min_np is not None and min_np > np:
        raise UsageError(f"-np {np} is below --min-np {min_np}")
    if fixed_hosts is None and not elastic_source:
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
            raise UsageError(f"{elastic_source} needs -np or --min-np")
    if min_np is None:
        min_np = np
    if max_np is not None and min_np > max_np:
        raise UsageError(f"--min-np {min_np} is above --max-np {max_np}")
    if max_np is not None and np > max_np:
        raise UsageError(f"-np {np} is above --max-np {max_np}")
    if fixed_hosts is not None and total_slots(fixed_hosts) < np:
        raise UsageError(f"-H has {total_slots(fixed_hosts)} slot(s) in all, fewer than -np {np}")
    return np, min_np, max_np, fixed_hosts or ()


def elastic_source(script: bool, join: bool, allocation: bool, ray: bool) -> str:
    """The flag of the source of hosts that changes, "" for none (fixed hosts)."""
    for flag, given in (
        ("--join", join),
        ("--host-discovery-script", script),
        ("--launcher slurm", allocation),
        ("--ray", ray),
    ):
        if given:
            return flag
    return ""
