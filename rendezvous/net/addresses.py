"""Which address of this machine other machines can reach (for every server the job runs).

A job across machines must never advertise a bare host name (it may resolve nowhere
else) nor a loopback address. The rule, as Horovod and MPI launchers do it, is to use
the local address of the route toward the peers: ``address_toward(peer)`` asks the
kernel which source address it would use to reach ``peer`` (a UDP ``connect``, which
sends nothing). ``--network-interface NAME`` picks an interface's address instead
(``interface_address``), ``--driver-address ADDR`` an explicit one.

Every function here raises ``AddressError`` with a one-line reason naming the host,
the interface or the address at fault, except ``is_local_host``, a question (does a host
name this machine?) that the driver, its launchers and its agents all ask.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import socket
import struct

from rendezvous.errors import RendezvousConfigError
from rendezvous.net.url import parse_store_url

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


class AddressError(RendezvousConfigError):
    """No usable address: a host that does not resolve or cannot be routed to, an
    interface without an IPv4 address, or a loopback address where peers are remote."""


def resolve(host: str) -> str:
    """``host`` as an IP address (an address stays as it is; a name is looked up).

    Raises:
        AddressError: the name does not resolve."""
    name = host.strip().strip("[]")
    try:
        return str(ipaddress.ip_address(name.split("%", 1)[0]))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise AddressError(f"host {host!r} does not resolve: {exc}") from None
    # IPv4 first: a dual-stack name is most often reached over IPv4 on clusters.
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and names that resolve to them (``localhost``)."""
    try:
        return ipaddress.ip_address(resolve(address)).is_loopback
    except AddressError:
        return False


def is_address(text: str) -> bool:
    """True when ``text`` is an IP address (not a name)."""
    try:
        ipaddress.ip_address(text.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


def default_route_address() -> str:
    """This machine's source address on its default route (nothing is sent).

    Raises:
        AddressError: there is no default route."""
    try:
        return address_toward("192.0.2.1")  # TEST-NET-1: never a real peer, routed by default
    except AddressError:
        raise AddressError("this machine has no default route") from None


def address_toward(peer: str) -> str:
    """This machine's source address for packets to ``peer`` (nothing is sent).

    Raises:
        AddressError: ``peer`` does not resolve, or no route leads to it."""
    target = resolve(peer)
    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((target, 9))  # UDP: picks the route, sends no packet
        except OSError as exc:
            raise AddressError(
                f"no route from this machine to {peer} ({target}): {exc.strerror or exc}"
            ) from None
        return str(probe.getsockname()[0])


def address_toward_store(store_url: str) -> str:
    """This process's address as its peers should see it, when nobody named one: the
    local address of its route toward the job's store at ``store_url`` (the job's hosts
    share that network), never a host name that may not resolve elsewhere; loopback for
    a store on loopback (a one-machine job).

    Raises:
        RendezvousConfigError: the store URL does not parse.
        AddressError: no route leads to the store.
    """
    endpoints = parse_store_url(store_url).endpoints
    if not endpoints:
        return "127.0.0.1"
    host = endpoints[0].host
    return "127.0.0.1" if is_loopback(host) else address_toward(host)


def interface_of(address: str) -> str | None:
    """The name of the interface that holds IPv4 ``address`` (None: no interface here
    has it, or it is no IPv4 address)."""
    for _, name in socket.if_nameindex():
        with contextlib.suppress(AddressError):
            if interface_address(name) == address:
                return name
    return None


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (e.g. ``eth0``).

    Raises:
        AddressError: no such interface, or it has no IPv4 address."""
    if not name or len(name.encode()) > 15 or "/" in name:
        raise AddressError(f"--network-interface {name!r} is not an interface name")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()))
        except OSError as exc:
            known = ", ".join(n for _, n in socket.if_nameindex())
            raise AddressError(
                f"--network-interface {name}: no IPv4 address on it "
                f"({exc.strerror or exc}; interfaces here: {known})"
            ) from None
    return socket.inet_ntoa(packed[20:24])


def advertised_address(
    peers: list[str], *, interface: str | None = None, explicit: str | None = None
) -> str:
    """The address this machine's servers announce to ``peers`` (host names or
    addresses of the machines that must reach it; empty for a one-machine job, which
    gets ``127.0.0.1``). ``explicit`` wins over ``interface``, which wins over the route.

    Peers that do not resolve or route are left out of the choice (their workers fail
    to start and say why); when none is left, the default route's address is used.

    Raises:
        AddressError: peers reached through different source addresses (multi-homed:
            choose with --network-interface), an unusable --driver-address or interface,
            no route at all, or a loopback address for remote peers (the message names
            both ends)."""
    remote = [p for p in peers if not is_loopback(p)]
    if explicit:
        address = resolve(explicit)
        source = f"--driver-address {explicit}"
    elif interface:
        address = interface_address(interface)
        source = f"--network-interface {interface}"
    elif not remote:
        return "127.0.0.1"
    else:
        by_address: dict[str, list[str]] = {}
        for peer in remote:
            try:
                by_address.setdefault(address_toward(peer), []).append(peer)
            except AddressError:
                continue  # a host nobody can reach: its workers fail to start, and say why
        if not by_address:
            # No host resolves or routes yet: the machine's own address on its default
            # route is what any host would reach, if one can.
            return default_route_address()
        if len(by_address) > 1:
            routes = "; ".join(f"{a} toward {', '.join(p)}" for a, p in by_address.items())
            raise AddressError(
                f"the hosts are reached from different local addresses ({routes}): "
                "choose one with --network-interface or --driver-address"
            )
        address = next(iter(by_address))
        source = "the route toward the hosts"
    if remote and ipaddress.ip_address(address).is_loopback:
        raise AddressError(
            f"{source} gives loopback address {address}, which the remote "
            f"hosts ({', '.join(remote)}) cannot reach"
        )
    return address


# ----------------------------------------------------------------------------- this machine

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


@functools.cache
def _own_names() -> frozenset[str]:
    """This machine's host name and fully qualified name (getfqdn may ask DNS: once)."""
    names = {socket.gethostname()}
    with contextlib.suppress(OSError):
        names.add(socket.getfqdn())
    return frozenset(n.lower() for n in names if n)


def _is_own_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True if this machine has ``address`` on an interface: binding to an address
    succeeds only for the machine's own addresses (no packet is sent)."""
    if address.is_loopback:
        return True
    if address.is_multicast:
        return False  # binding to a multicast group succeeds on any machine
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(address), 0))
        return True
    except OSError:
        return False


def _resolve_all(name: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


def name_reaches_out(name: str) -> bool:
    """True if ``name`` resolves to an address of this machine that is not loopback:
    what a program that binds to its host name's address (gloo does) needs to be
    reached from another machine."""
    return any(
        not address.is_loopback and _is_own_address(address) for address in _resolve_all(name)
    )


@functools.lru_cache(maxsize=4096)
def is_local_host(host: str) -> bool:
    """True if ``host`` names this machine: localhost, a loopback address (127.x, ::1),
    this machine's host name or FQDN, one of its own addresses, or a name that resolves to
    one of those. A name that does not resolve is not local. Results are cached for the
    life of the process (the lookups may ask DNS)."""
    name = host.strip().strip("[]").lower()
    if not name:
        return False
    try:  # an address needs no name lookup (this machine's FQDN may ask a slow DNS)
        literal = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        pass
    else:
        return _is_own_address(literal)
    if name in _LOOPBACK_NAMES or name in _own_names():
        return True
    return any(_is_own_address(address) for address in _resolve_all(name))
