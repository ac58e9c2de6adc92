"""How a job is wired to its processes and its store (pure, except ``open_job_store``).

* ``JobWiring``/``WorkerSeat``: what every process of the job is told (its config, its
  secret, its store), and where one worker runs (its id, host, slot, bind address);
* ``job_env``/``worker_env``: the variables every process of the job, and each worker,
  is given on top of what it inherits (``rendezvous.env`` names them);
* ``torchrun_env``/``world_spec``: a worker of a world of restart mode
  (``--restart-workers``): the variables torchrun gives it, and its launch (through
  ``driver.programs.world_entry``, which adds ``MASTER_ADDR``/``MASTER_PORT``);
* ``runs_all_local``: whether every process of the job runs on this machine;
* ``worker_spec``: the ``LaunchSpec`` of one worker, with its id, its bind address and
  its log file;
* ``shard_commands``: the ps shards' command lines (``--num-ps``, ``--ps-replicas``);
* ``open_job_store``: the store the job's processes meet in: the driver's own embedded
  server, or the etcd cluster of ``--rendezvous`` (a second client of it whose calls
  give up within seconds is ``driver.quick_store``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

from driver.config import JobConfig
from driver.errors import DiscoveryError
from driver.hosts.discovery import DEFAULT_SCRIPT_TIMEOUT
from driver.hosts.slots import HostSlots
from driver.hosts.slurm import node_addresses
from driver.launch.spec import LaunchSpec
from driver.policy.planner import Seat, World
from driver.ps.command import shard_command
from rendezvous import env, open_store
from rendezvous.backends.embedded import EmbeddedServer
from rendezvous.net import addresses
from rendezvous.net.addresses import is_local_host
from rendezvous.net.url import Endpoint
from rendezvous.store import KVStore

log = logging.getLogger(__name__)


def job_env(config: JobConfig, secret: str, store_url: str) -> dict[str, str]:
    """What every process of the job (worker or ps shard) is told about it (pure)."""
    return {
        env.ENV_RENDEZVOUS: store_url,
        env.ENV_JOB_ID: config.job_id,
        env.ENV_SECRET: secret,
        # The etcd client needs it before protobuf loads, whatever the script imports first.
        "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python",
        # Output is forwarded line by line: do not let Python hold it back.
        "PYTHONUNBUFFERED": os.environ.get("PYTHONUNBUFFERED", "1"),
    }


@dataclass(frozen=True)
class JobWiring:
    """What every process of one job is started with: the job's ``config``, its
    ``secret`` and the URL of the store its processes meet in (``store_url``)."""

    config: JobConfig
    secret: str
    store_url: str

    def env(self) -> dict[str, str]:
        """``job_env`` of this job."""
        return job_env(self.config, self.secret, self.store_url)


@dataclass(frozen=True)
class WorkerSeat:
    """Where one worker runs: its id (``worker_id``), its ``host``, its ``slot`` (a
    spare's: its index among its host's spares, ``spare`` True), and what it binds its
    listener to and advertises (``bind_host``: ``worker_bind_host``)."""

    worker_id: str
    host: str
    slot: int
    bind_host: str
    spare: bool = False


def worker_env(wiring: JobWiring, seat: WorkerSeat) -> dict[str, str]:
    """The job's own variables for the worker in ``seat`` (pure); they are added to the
    inherited ones. A spare is told so."""
    config = wiring.config
    return {
        **wiring.env(),
        env.ENV_WORKER_ID: seat.worker_id,
        env.ENV_HOST: seat.host,
        env.ENV_SLOT: str(seat.slot),
        env.ENV_BIND_HOST: seat.bind_host,
        env.ENV_ROUND_TIMEOUT: str(config.elastic_timeout),
        env.ENV_PROGRESS_INTERVAL: str(config.progress_interval),
        env.ENV_HANG_TIMEOUT: "" if config.hang_timeout is None else str(config.hang_timeout),
        **({env.ENV_SPARE: "1"} if seat.spare else {}),
        **snapshot_env(config),
    }


MAX_RESTARTS_UNLIMITED = 2**31 - 1
"""``TORCHELASTIC_MAX_RESTARTS`` without ``--reset-limit`` (torchrun takes a count: one
no job reaches, so that ``max - restart count`` is the restarts a script has left)."""


def torchrun_env(job_id: str, world: World, seat: Seat, reset_limit: int | None) -> dict[str, str]:
    """What torchrun tells a worker, for the one in ``seat`` of ``world`` (pure): its
    ranks and the world's sizes, the restarts so far and allowed, the run's id (the job
    id); rank 0 serves torch's store itself (``TORCHELASTIC_USE_AGENT_STORE`` False:
    no agent holds one). ``MASTER_ADDR`` and ``MASTER_PORT`` are not known here: rank
    0's host picks the port when the world starts (``driver.programs.world_entry``)."""
    size, rank = str(world.size), str(seat.rank)
    max_restarts = reset_limit if reset_limit is not None else MAX_RESTARTS_UNLIMITED
    return {
        env.TORCH_RANK: rank,
        env.TORCH_LOCAL_RANK: str(seat.local_rank),
        env.TORCH_WORLD_SIZE: size,
        env.TORCH_LOCAL_WORLD_SIZE: str(seat.local_size),
        env.TORCH_GROUP_RANK: str(seat.group_rank),
        env.TORCH_GROUP_WORLD_SIZE: str(len(world.hosts)),
        # One role, the whole world: its ranks are the world's.
        env.TORCH_ROLE_NAME: "default",
        env.TORCH_ROLE_RANK: rank,
        env.TORCH_ROLE_WORLD_SIZE: size,
        env.TORCH_RESTART_COUNT: str(world.restarts),
        env.TORCH_MAX_RESTARTS: str(max_restarts),
        env.TORCH_RUN_ID: job_id,
        env.TORCH_USE_AGENT_STORE: "False",
    }


def world_spec(wiring: JobWiring, worker: WorkerSeat, world: World, seat: Seat) -> LaunchSpec:
    """The launch of ``worker`` in ``seat`` of ``world`` (restart mode: ``worker`` is in
    the seat's host and slot): the job's
    command behind ``python -m driver.programs.world_entry`` (the driver's Python, which
    every host shares, as for the agents), which learns ``MASTER_ADDR``/``MASTER_PORT``
    and then becomes the command (exec: the same process); labelled and logged as any
    worker. It is told the job's store (to meet rank 0 there), its worker id, where it
    may bind, how long it waits for rank 0 (``--start-timeout``) and its world's number.

    Raises:
        LaunchSpecError: the command or an environment value is unusable.
    """
    config = wiring.config
    variables = {
        **wiring.env(),
        env.ENV_WORKER_ID: worker.worker_id,
        env.ENV_HOST: seat.host,
        env.ENV_BIND_HOST: worker.bind_host,
        **seat_env(config, world, seat),
    }
    command = (sys.executable, "-m", "driver.programs.world_entry", "--", *config.command)
    return replace(worker_spec(wiring, worker), command=command, env=variables)


def seat_env(config: JobConfig, world: World, seat: Seat) -> dict[str, str]:
    """What the worker in ``seat`` of ``world`` is told of its seat (pure): its slot,
    torchrun's variables, its world's number and how long it waits for rank 0
    (``--start-timeout``). A warm spare given the seat is told the same
    (``rendezvous.schema.worlds.WorldSeat``)."""
    return {
        env.ENV_SLOT: str(seat.slot),
        env.ENV_ROUND_TIMEOUT: f"{config.start_timeout:g}",
        env.ENV_WORLD: str(world.number),
        **torchrun_env(config.job_id, world, seat, config.reset_limit),
    }


def world_spare_spec(wiring: JobWiring, seat: WorkerSeat) -> LaunchSpec:
    """The launch of the warm spare in ``seat`` in restart mode: the job's command
    behind ``python -m driver.programs.world_spare``, which imports what the program
    imports, registers, and waits for a seat in a world (``seat_env``, under
    ``JobKeys.world_seat``); labelled ``host#I`` and logged as any spare.

    Raises:
        LaunchSpecError: the command or an environment value is unusable.
    """
    command = (sys.executable, "-m", "driver.programs.world_spare", "--", *wiring.config.command)
    return replace(worker_spec(wiring, replace(seat, spare=True)), command=command)


def snapshot_env(config: JobConfig) -> dict[str, str]:
    """Where the workers write their snapshots and how often (``--checkpoint-dir``);
    nothing without a directory (pure)."""
    if not config.checkpoint_dir:
        return {}
    return {
        env.ENV_CHECKPOINT_DIR: config.checkpoint_dir,
        env.ENV_CHECKPOINT_INTERVAL: f"{config.checkpoint_interval:g}",
    }


def driver_address(config: JobConfig, hosts: Sequence[HostSlots]) -> str:
    """The address the driver's servers advertise to the job's hosts: ``--driver-address``,
    else ``--network-interface``'s, else the local address of the route toward the remote
    hosts (loopback when every host is this one; in join mode, toward the store; with
    ``--launcher slurm``, toward the nodes' Slurm addresses). With a discovery script that lists only
    this machine so far, hosts may come later: the address of the default route then
    (loopback when there is none, with a warning to choose one).

    Raises:
        AddressError: an unusable choice, remote hosts without a route, or loopback
            toward remote hosts (the message names both ends).
    """
    if config.join is not None:  # host names are the nodes' labels: route toward the store
        stores = [e.host for e in config.rendezvous.endpoints]
        return addresses.advertised_address(
            stores, interface=config.network_interface, explicit=config.driver_address
        )
    if config.launcher == "slurm":  # node names are Slurm's labels: route toward NodeAddr
        try:
            found = node_addresses([h.host for h in hosts], DEFAULT_SCRIPT_TIMEOUT)
        except DiscoveryError as exc:
            raise addresses.AddressError(f"--launcher slurm: {exc}") from None
        return addresses.advertised_address(
            [a for a in found.values() if not is_local_host(a)],
            interface=config.network_interface,
            explicit=config.driver_address,
        )
    remote = [h.host for h in hosts if not is_local_host(h.host)]
    if (
        not remote
        and config.uses_discovery
        and not (config.driver_address or config.network_interface)
    ):
        try:
            return addresses.default_route_address()
        except addresses.AddressError:
            log.warning(
                "this machine has no default route: hosts discovered later will not reach "
                "the driver at 127.0.0.1 (choose an address with --driver-address)"
            )
            return "127.0.0.1"
    return addresses.advertised_address(
        remote, interface=config.network_interface, explicit=config.driver_address
    )


def names_are_labels(config: JobConfig) -> bool:
    """The hosts' names are labels, never resolved here: joined nodes', Slurm's nodes'."""
    return config.join is not None or config.launcher == "slurm"


def runs_all_local(config: JobConfig) -> bool:
    """Every process of the job runs on this machine: with ``--launcher local`` (host
    names are then only labels, and need not resolve), or when every fixed host is this
    machine. Everything then binds and advertises loopback."""
    return config.launcher == "local" or (
        not config.uses_discovery and all(is_local_host(h.host) for h in config.hosts)
    )


def worker_bind_host(host: str, all_local: bool, driver_address: str, labels: bool = False) -> str:
    """What a worker on ``host`` binds its listener to and advertises: loopback in a
    one-machine job, the driver's own address on the driver's machine, the host's address
    when ``host`` is one; for a host known by name, or when host names are ``labels`` (a
    joined node's, a Slurm node's), nothing: the worker then uses its own address toward
    the store (a name may not resolve on the other hosts)."""
    if all_local:
        return "127.0.0.1"
    if labels:
        return ""
    if is_local_host(host):
        return driver_address
    return host if addresses.is_address(host) else ""


def worker_id_for(host: str, slot: int | str, sequence: int) -> str:
    """A worker id unique in the job: ``host-slot-N`` with the host made file-name safe
    (a spare's ``slot`` is ``sI``, its spare index)."""
    safe_host = "".join(c if c.isalnum() or c in "-." else "_" for c in host)
    return f"{safe_host}-{slot}-{sequence}"


def worker_spec(wiring: JobWiring, seat: WorkerSeat) -> LaunchSpec:
    """The launch of the worker in ``seat``: the job's command in the driver's working directory,
    labelled ``host:slot`` (a spare: ``host#I``, its spare index), logged to
    ``--log-dir`` if given.

    Raises:
        LaunchSpecError: the command or an environment value is unusable.
    """
    config, host, slot = wiring.config, seat.host, seat.slot
    log_path = os.path.join(config.log_dir, f"{seat.worker_id}.log") if config.log_dir else None
    return LaunchSpec(
        host=host,
        slot=slot,
        command=tuple(config.command),
        env=worker_env(wiring, seat),
        cwd=os.getcwd(),
        label=f"{host}#{slot}" if seat.spare else f"{host}:{slot}",
        log_path=log_path,
    )


def shard_commands(config: JobConfig, bind_host: str) -> list[tuple[str, ...]]:
    """The command line of each ps shard (checkpoint directory made absolute)."""
    return [shard_command_for(config, i, bind_host) for i in range(config.num_ps)]


def shard_command_for(config: JobConfig, index: int, bind_host: str) -> tuple[str, ...]:
    """The command line of ps shard ``index`` binding ``bind_host``."""
    checkpoint_dir = os.path.abspath(config.ps_checkpoint_dir) if config.ps_checkpoint_dir else None
    return shard_command(
        index,
        config.num_ps,
        config.ps_mode,
        bind_host,
        checkpoint_dir,
        config.ps_checkpoint_interval,
        config.ps_replicas,
        verbose=config.verbosity > 0,
    )


def open_job_store(
    config: JobConfig, secret: str, all_local: bool, advertised_host: str
) -> tuple[EmbeddedServer | None, KVStore, str]:
    """The embedded server the driver runs (None with etcd), a client of the store, and
    the store URL workers use. (Keys an earlier job with the same id left are deleted
    when the driver claims the job id: ``driver.leadership.claim``.)

    Raises:
        RendezvousError: the store cannot be started or reached.
    """
    server = None
    # (embedded://HOST:PORT with --join: a node serves it, this driver is its client)
    if config.rendezvous.scheme == "embedded" and not config.rendezvous.endpoints:
        server = EmbeddedServer(secret, bind="127.0.0.1:0" if all_local else "0.0.0.0:0")
        port = Endpoint.parse(server.start(), "the embedded store's address").port
        url = f"embedded://{Endpoint('127.0.0.1' if all_local else advertised_host, port)}"
    else:
        url = str(config.rendezvous)
    try:
        store = open_store(url, secret)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    return server, store, url
