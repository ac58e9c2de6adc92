"""The driver's typed errors.

Every class derives from ``rendezvous.errors.ElasticError`` (the project's root), so
``elastic-run`` can catch one base, print ``str(error)`` as its one-line reason, and
exit non-zero. Messages are single lines: they name the flag, script or host at fault.
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

    Raised by ``driver.hosts.parse_host_slots``. Callers re-raise it as ``UsageError``
    (``-H``) or ``DiscoveryError`` (script output) with where the entry came from."""


class DiscoveryError(DriverError):
    """Host discovery failed: the script could not be run, exited non-zero, timed out,
    or printed a line that does not parse. The message names the script (and the line)."""
