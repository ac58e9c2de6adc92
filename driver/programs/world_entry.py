"""``python -m driver.programs.world_entry -- COMMAND [ARG...]``: how a worker of a world
of restart mode (``elastic-run --restart-workers``) begins on its host, before its
program runs.

torch's ``init_process_group`` needs ``MASTER_ADDR`` and ``MASTER_PORT``: where rank 0
serves torch's store. Only rank 0's host knows a port free there, so when a world
starts:

* rank 0 takes a free port of its host (the kernel's pick for port 0, let go at once
  for torch to bind, as torchrun does) and writes it, with its address toward the job's
  store (``ELASTIC_BIND_HOST`` when the driver named one: the address every host
  reaches it at), under ``JobKeys.world_master(world)``;
* every other rank waits for that record, up to ``ELASTIC_ROUND_TIMEOUT`` (the driver
  stops the world long before when rank 0 is gone);
* then each *becomes* the command (``exec``: the same process, so the driver's and the
  agents' hold on it is the program's), with ``MASTER_ADDR`` and ``MASTER_PORT`` set
  and the job's wiring (its store, its secret, the worker's id) taken away: the program
  needs none of it, and ``elastic.init()`` in it must not take it for a worker of ours.
  As torchrun does, ``OMP_NUM_THREADS`` is 1 when several workers share the host and
  the user did not set it. In a world across hosts, when this host's name does not
  resolve to an address other hosts reach (gloo binds to that name's address: a
  loopback one on many machines, which fails across hosts), ``GLOO_SOCKET_IFNAME``
  names the interface of the worker's address, unless the user set it.

Exit codes before the program runs: 127 when it is not found and 126 when it cannot be
run (as a shell says them: the driver ends the job with what failed), 1 when rank 0
cannot be met, each with one line on stderr.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from driver.errors import WorldEntryError
from rendezvous import env, open_store
from rendezvous.errors import ElasticError
from rendezvous.keys import JobKeys
from rendezvous.net import addresses
from rendezvous.process_exit import run_then_exit
from rendezvous.schema.worlds import WorldMaster
from rendezvous.store import KVStore

WIRING = (
    env.ENV_RENDEZVOUS,
    env.ENV_JOB_ID,
    env.ENV_SECRET,
    env.ENV_WORKER_ID,
    env.ENV_HOST,
    env.ENV_SLOT,
    env.ENV_BIND_HOST,
    env.ENV_ROUND_TIMEOUT,
    env.ENV_WORLD,
)
"""What the driver tells a world's worker for this module alone: not the program's."""

CANNOT_RUN = {FileNotFoundError: 127, PermissionError: 126}
"""A shell's exit codes for a command it cannot run (the driver reads them so)."""


@dataclass(frozen=True)
class Entry:
    """What the driver told this worker (``from_env``): the job's store and secret, the
    job id, its world's number, its rank, the sizes of the world and of its host's share
    of it, its host's name in the job, the address it may bind ("": its route toward the
    store), and how long it waits for rank 0."""

    store_url: str
    secret: str
    job_id: str
    world: int
    rank: int
    world_size: int
    local_size: int
    host: str
    bind_host: str
    timeout: float

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Entry:
        """Read the driver's variables from ``environ``.

        Raises:
            WorldEntryError: one is missing or does not parse (named).
        """

        def needed(name: str) -> str:
            value = env.text(name, None, environ)
            if value is None:
                raise WorldEntryError(f"{name} is not set: this is for elastic-run to start")
            return value

        try:
            needed(env.ENV_WORLD)
            return cls(
                store_url=needed(env.ENV_RENDEZVOUS),
                secret=needed(env.ENV_SECRET),
                job_id=needed(env.ENV_JOB_ID),
                world=env.integer(env.ENV_WORLD, 1, environ, minimum=1),
                rank=env.integer(env.TORCH_RANK, 0, environ, minimum=0),
                world_size=env.integer(env.TORCH_WORLD_SIZE, 1, environ, minimum=1),
                local_size=env.integer(env.TORCH_LOCAL_WORLD_SIZE, 1, environ, minimum=1),
                host=env.text(env.ENV_HOST, "", environ) or "",
                bind_host=env.text(env.ENV_BIND_HOST, "", environ) or "",
                timeout=env.number(env.ENV_ROUND_TIMEOUT, 120.0, environ),
            )
        except ElasticError as exc:  # a RendezvousConfigError naming the variable
            raise WorldEntryError(str(exc)) from None


def own_address(entry: Entry) -> str:
    """The address other hosts reach this worker at (see the module docstring).

    Raises:
        RendezvousConfigError: no route leads to the store.
    """
    return entry.bind_host or addresses.address_toward_store(entry.store_url)


def free_port() -> int:
    """A TCP port free on every address of this host now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def meet_master(entry: Entry, store: KVStore) -> WorldMaster:
    """Rank 0: take a port and say where it serves; the others: wait until it said so.

    Raises:
        RendezvousError: the store cannot be used, or rank 0 said nothing within
            ``entry.timeout``.
        RendezvousConfigError: (rank 0) no route leads to the store.
    """
    key = JobKeys(entry.job_id).world_master(entry.world)
    if entry.rank == 0:
        master = WorldMaster(entry.world, own_address(entry), free_port(), entry.host)
        store.put(key, master.to_json())
        return master
    kv = store.wait_for(key, lambda kv: kv is not None, entry.timeout)
    assert kv is not None  # (wait_for returns what the predicate accepted)
    return WorldMaster.from_json(kv.value)


def program_env(
    environ: Mapping[str, str], master: WorldMaster, local_size: int, interface: str | None
) -> dict[str, str]:
    """The environment the program runs with (pure; see the module docstring):
    ``environ`` without the job's wiring, with rank 0's address and port, one OpenMP
    thread when ``local_size`` workers share the host, ``interface`` for gloo."""
    variables = {k: v for k, v in environ.items() if k not in WIRING}
    variables[env.TORCH_MASTER_ADDR] = master.address
    variables[env.TORCH_MASTER_PORT] = str(master.port)
    if local_size > 1:
        variables.setdefault(env.OMP_NUM_THREADS, "1")
    if interface is not None:
        variables.setdefault(env.GLOO_SOCKET_IFNAME, interface)
    return variables


def gloo_interface(entry: Entry, environ: Mapping[str, str]) -> str | None:
    """The interface gloo must bind in this world, when it cannot find it by this host's
    name (see the module docstring); None when it can, or need not."""
    if entry.world_size == entry.local_size or env.GLOO_SOCKET_IFNAME in environ:
        return None  # one host: gloo's own choice (even loopback) reaches every peer
    if addresses.name_reaches_out(socket.gethostname()):
        return None
    try:
        return addresses.interface_of(own_address(entry))
    except ElasticError:
        return None  # no route to the store: the program fails to meet its peers, and says so


def run(command: Sequence[str], variables: Mapping[str, str]) -> int:
    """Become ``command``; returns only when it cannot be run: its exit code (see
    ``CANNOT_RUN``), after one line on stderr."""
    try:
        os.execvpe(command[0], list(command), dict(variables))
    except OSError as exc:
        print(
            f"elastic-run: cannot start {command[0]!r}: {exc.strerror or exc}",
            file=sys.stderr,
            flush=True,
        )
        return next((code for kind, code in CANNOT_RUN.items() if isinstance(exc, kind)), 126)


def command_line(argv: Sequence[str] | None, module: str) -> list[str] | None:
    """The command after ``--`` in ``argv`` (default: this process's arguments); None,
    after the usage line of ``module`` on stderr, when there is none."""
    command = list(sys.argv[1:] if argv is None else argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print(f"usage: python -m {module} -- COMMAND [ARG...]", file=sys.stderr)
        return None
    return command


def main(argv: Sequence[str] | None = None) -> int:
    """Meet rank 0, then become the command (see the module docstring); the exit code
    when the command never ran."""
    command = command_line(argv, "driver.programs.world_entry")
    if command is None:
        return 2
    environ = dict(os.environ)
    try:
        entry = Entry.from_env(environ)
        with open_store(entry.store_url, entry.secret) as store:
            master = meet_master(entry, store)
        variables = program_env(environ, master, entry.local_size, gloo_interface(entry, environ))
    except ElasticError as exc:
        print(f"elastic-run: this worker cannot meet rank 0 of its world: {exc}", file=sys.stderr)
        return 1
    return run(command, variables)


if __name__ == "__main__":
    run_then_exit(main)  # no finalization to hang in (rendezvous.process_exit)
