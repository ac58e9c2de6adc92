"""The parts a job is made of when its caller gives none: what ``elastic-run`` uses.

``Job`` takes its launcher, event sink and host discovery as arguments, so that tests
drive the whole loop with fakes; ``elastic-run`` gives none, and gets these: the
launcher of ``--launcher`` (with ``ELASTIC_SSH_OPTIONS``), an ``EventLog`` of
``--events``, the discovery of ``-H`` or ``--host-discovery-script``; and
``--log-dir`` made. Apart from the loop because each is chosen once, from the config,
before the job starts; a bad choice is the user's (``UsageError``), not the job's.
"""

from __future__ import annotations

import os

from driver.config import JobConfig
from driver.errors import EventLogError, UsageError
from driver.events.log import EventLog
from driver.hosts.discovery import DiscoverySettings, HostDiscovery
from driver.hosts.registry import make_discovery, source_name
from driver.launch.assignments.handle import uses_agent
from driver.launch.assignments.launcher import AgentLauncher
from driver.launch.assignments.service import AgentStarts
from driver.launch.base import Launcher
from driver.launch.registry import get_launcher
from driver.launch.spec import ssh_settings_from_env
from driver.quick_store import quick_store
from rendezvous.keys import JobKeys
from rendezvous.net.addresses import is_local_host


def make_log_dir(config: JobConfig) -> None:
    """Create ``--log-dir`` (and its parents) if given.

    Raises:
        UsageError: it cannot be created.
    """
    if config.log_dir:
        try:
            os.makedirs(config.log_dir, exist_ok=True)
        except OSError as exc:
            raise UsageError(
                f"--log-dir {config.log_dir}: cannot create it: {exc.strerror or exc}"
            ) from None


def event_log(config: JobConfig) -> EventLog:
    """The event log of ``--events`` (stderr lines, timestamped; more with ``-v``).

    Raises:
        UsageError: the ``--events`` file cannot be opened.
    """
    try:
        return EventLog(config.events_file, verbose=config.verbosity > 0, timestamps=True)
    except EventLogError as exc:
        raise UsageError(f"--events: {exc}") from None


def launcher(config: JobConfig) -> Launcher:
    """The launcher of ``--launcher``, with the ssh options of ``ELASTIC_SSH_OPTIONS``."""
    return get_launcher(
        config.launcher,
        ssh_settings=ssh_settings_from_env(os.environ),
        ray_address=config.ray or "",
    )


def agent_launcher(config: JobConfig) -> AgentLauncher:
    """The launcher of ``--launcher`` behind per-host agents: through agents for the
    hosts ``driver.launch.assignments.handle.uses_agent`` picks (every host with etcd,
    the ssh hosts with the embedded store), directly for the others."""
    base = launcher(config)
    etcd = config.rendezvous.scheme == "etcd"

    def use_agent(host: str) -> bool:
        if config.join is not None:
            return True  # a joined node's own agent, or one started on a host of -H
        local = config.launcher == "local" or (config.launcher == "auto" and is_local_host(host))
        # (slurm: every host a step of the allocation, its agent the job's store client)
        return uses_agent(local, etcd)

    starts = AgentStarts(
        job_id=config.job_id,
        driver_timeout=config.driver_timeout,
        detach=etcd or config.join is not None,  # (join: any node may lead next)
        joined=config.join is not None,
        # in join mode, the hosts of -H or a script get agents started as without it
        starts_agents=config.join is None or bool(config.hosts or config.discovery_script),
    )
    return AgentLauncher(base, base, starts, use_agent=use_agent)


def discovery(config: JobConfig) -> HostDiscovery:
    """The source of hosts the flags pick (``driver.hosts.registry``): the joined nodes
    (``--join``: read from the store by a client of its own), the hosts of
    ``--host-discovery-script``, else the fixed ones (``-H``, or localhost)."""
    read_agents = None
    if config.join is not None:
        store, keys = (
            quick_store(str(config.rendezvous), config.join.secret),
            JobKeys(config.job_id),
        )

        def read_agents() -> list[bytes]:
            return [kv.value for kv in store.get_prefix(keys.agents)[0]]

    settings = DiscoverySettings(
        hosts=tuple(config.hosts),
        script=config.discovery_script or "",
        default_slots=config.slots_per_host,
        timeout=config.discovery_timeout,
        read_agents=read_agents,
        allocation=config.allocation,
        slurm_slots=config.slots_per_host if config.slots_given else None,
        ray_address=config.ray or "",
    )
    return make_discovery(source_name(settings), settings)
