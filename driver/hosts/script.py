"""The ``script`` source of hosts: the user's ``--host-discovery-script``.

The parsing of a script's output is a pure function (``parse_discovery_output``);
``ScriptDiscovery`` only adds the running of the script. What to do when discovery fails
(fatal on the first call, logged and retried later, per docs/DESIGN.md) is the driver's
policy, not this module's.

Output format: one host per line, ``HOST`` or ``HOST:SLOTS``; blank lines and ``#``
comments (whole-line or trailing) are ignored. A host listed twice is an error rather
than merged: ``a:2`` then ``a:4`` could mean 6 or 4 slots, and guessing wrong places
workers on slots that do not exist.
"""

from __future__ import annotations

from driver.errors import DiscoveryError, HostSpecError
from driver.hosts.command import Commands
from driver.hosts.discovery import DEFAULT_SCRIPT_TIMEOUT, HostDiscovery
from driver.hosts.slots import (
    MAX_LISTED_SLOTS,
    HostSlots,
    check_listed_slots,
    parse_host_slots,
    quote_entry,
)


def parse_discovery_output(text: str, default_slots: int, source: str) -> tuple[HostSlots, ...]:
    """The hosts listed in ``text`` (a discovery script's stdout), in order.

    ``default_slots`` is used for lines without ``:SLOTS``; ``source`` names the origin in
    error messages. Raises ``DiscoveryError`` naming ``source``, the line number and the
    line for a line that does not parse or a host listed twice."""
    hosts: list[HostSlots] = []
    first_line_of: dict[str, int] = {}
    listed = 0
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        where = f"{source}: line {number} {quote_entry(line.strip())}"
        try:
            host = parse_host_slots(entry, default_slots)
        except HostSpecError as e:
            raise DiscoveryError(f"{where}: {e}") from None
        if host.host in first_line_of:
            raise DiscoveryError(
                f"{where}: host {host.host!r} already listed on line {first_line_of[host.host]}"
            )
        listed += host.slots
        if listed > MAX_LISTED_SLOTS:  # stop at once: the rest could be millions of lines
            try:
                check_listed_slots((*hosts, host), f"{source} (up to line {number})")
            except HostSpecError as e:
                raise DiscoveryError(str(e)) from None
        first_line_of[host.host] = number
        hosts.append(host)
    return tuple(hosts)


class ScriptDiscovery(HostDiscovery):
    """Runs the user's discovery script (no arguments, the driver's environment:
    ``run_bounded``) and parses its output."""

    def __init__(self, path: str, default_slots: int = 1, timeout: float = DEFAULT_SCRIPT_TIMEOUT):
        self.path = path
        self.default_slots = default_slots
        self.timeout = timeout
        self._commands = Commands()

    def cancel(self) -> None:
        self._commands.cancel()

    def __repr__(self) -> str:
        return f"ScriptDiscovery({self.path!r}, default_slots={self.default_slots}, timeout={self.timeout})"

    def find_hosts(self) -> tuple[HostSlots, ...]:
        """Run the script once. Raises ``DiscoveryError`` if it cannot be started, exits
        non-zero (message: status and the tail of its stderr), does not finish within
        ``timeout`` seconds, or prints a line that does not parse."""
        source = f"discovery script {self.path}"
        stdout = self._commands.run([self.path], self.timeout, source)
        return parse_discovery_output(stdout, self.default_slots, source)
