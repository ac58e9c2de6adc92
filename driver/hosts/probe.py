"""Is a host still there? The driver's second opinion when workers report a silent peer.

A host cut off the network (a dead switch port, a machine that lost power) closes no
connection: its peers only stop hearing from it. A stopped or merely slow process looks
the same to them. The driver tells the two apart by asking the host's kernel directly:
a TCP connection to the silent worker's listener is accepted (or refused) by a live
host within a round trip, whatever its processes do, and gets no answer at all from a
host that is gone. One attempt, bounded by ``timeout``: the first SYN is resent only
after a second, so waiting longer buys nothing on a local network.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from rendezvous.errors import RendezvousConfigError
from rendezvous.net.url import Endpoint

#: seconds a host has to answer a connection attempt (a live one answers in well under
#: a millisecond on a LAN, even when its CPUs are saturated: the kernel answers)
PROBE_TIMEOUT = 0.5

# Errors that mean no host answered, as opposed to a host that refused (it is there).
_UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT, errno.EHOSTDOWN}


@dataclass(frozen=True)
class ProbeResult:
    """``reachable``: the host at ``address`` answered (accepted or refused)."""

    address: str
    reachable: bool
    detail: str


def probe(address: str, timeout: float = PROBE_TIMEOUT) -> ProbeResult:
    """Try one TCP connection to ``address`` (``host:port``) and close it at once."""
    try:
        endpoint = Endpoint.parse(address, "a worker's registered address")
    except RendezvousConfigError as exc:
        return ProbeResult(address, True, f"not probed: {exc}")  # no evidence either way
    try:
        with socket.create_connection(endpoint.sockaddr, timeout=timeout):
            return ProbeResult(address, True, "accepted")
    except ConnectionRefusedError:
        return ProbeResult(address, True, "refused (the host answered)")
    except TimeoutError:
        return ProbeResult(address, False, f"no answer within {timeout:g}s")
    except OSError as exc:
        if exc.errno in _UNREACHABLE:
            return ProbeResult(address, False, exc.strerror or str(exc))
        return ProbeResult(address, True, f"not judged: {exc.strerror or exc}")
