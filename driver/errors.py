"""The driver's typed errors, in one place.

Every class derives from ``DriverError``, itself a ``rendezvous.errors.ElasticError``
(the project's root), so ``elastic-run`` can catch one base, print ``str(error)`` as its
one-line reason, and exit non-zero. Messages are single lines: they name the flag,
script, host or file at fault.
"""

from __future__ import annotations

from rendezvous.errors import ElasticError


class DriverError(ElasticError):
    """Base of the errors raised by the driver and the ``elastic-run`` command."""


class UsageError(DriverError, ValueError):
    """The command line is unusable: a bad flag value or a bad combination of flags.

    Raised by ``driver.config.parse_args``; the message names the flag and the problem."""


class HostSpecError(DriverError, ValueError):
    """A ``HOST[:SLOTS]`` entry does not parse (empty host, bad name, bad slot count).

    Raised by ``driver.hosts.slots.parse_host_slots``. Callers re-raise it as ``UsageError``
    (``-H``) or ``DiscoveryError`` (script output) with where the entry came from."""


class DiscoveryError(DriverError):
    """Host discovery failed: the script could not be run, exited non-zero, timed out,
    or printed a line that does not parse. The message names the script (and the line)."""


class UnknownDiscoveryError(DiscoveryError, ValueError):
    """``make_discovery`` was given a source name it does not know."""


class JobFailed(DriverError):
    """The job cannot succeed; the message is the one-line reason ``elastic-run`` prints."""


class JobIdInUseError(JobFailed):
    """Another driver leads a job with this ``--job-id`` in the store (its record is
    alive); the message names that driver (pid, host, since when)."""


class LeadershipLost(DriverError):
    """Another driver took over the job (a newer term holds the leader key): this one
    steers nothing more. The message names the new leader; ``elastic-run`` exits with
    status 3 and leaves the job's processes running for the new leader."""


class JobStopped(DriverError):
    """SIGTERM or SIGINT stopped the job (after its final snapshot, with
    ``--checkpoint-dir``): no failure, the same command resumes it. ``signum``: the
    signal; ``elastic-run`` exits with 128 + it."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class JobLeft(DriverError):
    """A joined node left the job on purpose (SIGTERM: a preemption, a scale-down): its
    host drains, the lead (if it had it) goes to another node, the job goes on without
    it; ``elastic-run`` exits 0."""


class JobEnded(DriverError):
    """A ``--standby`` driver saw its leader go and nothing of the job is left: the job
    ended under its leader, there is nothing to take over (``elastic-run`` exits 0)."""


# ----------------------------------------------------------------------------- launching


class LauncherError(DriverError):
    """Base of the errors of ``driver.launch``."""


class LaunchSpecError(LauncherError, ValueError):
    """A ``LaunchSpec`` or ``SSHSettings`` value is unusable (empty command, bad variable
    name, a host that looks like an option, ...)."""


class LaunchError(LauncherError):
    """The worker process could not be started (command or ``ssh`` not found, missing
    working directory, no permission). Failures after the start are exit codes.

    ``permanent``: every try would fail alike (the program is missing or not executable,
    the working directory is missing), as opposed to a machine short of processes or
    memory for a moment."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


class UnknownLauncherError(LauncherError, ValueError):
    """``get_launcher`` was given a name it does not know."""


class WorldEntryError(LauncherError):
    """A worker of a world (``--restart-workers``) cannot start its program: what the
    driver told it does not parse, or rank 0's address cannot be had (the store, the
    deadline) (``driver.programs.world_entry``)."""


# ----------------------------------------------------------------------------- events


class EventError(DriverError, ValueError):
    """``EventLog.emit`` was given something that is not an event of the vocabulary, or
    an event class declares a field the log reserves (``t``, ``elapsed``, ``kind``)."""


class EventLogError(DriverError):
    """The events file could not be opened."""


class PlotError(DriverError):
    """A run cannot be drawn: the events file cannot be read or holds no usable event,
    or the renderer (matplotlib, the ``plot`` extra) is not installed."""
