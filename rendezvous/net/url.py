"""Parsing of store URLs (pure): ``embedded://HOST:PORT``, ``etcd://HOST:PORT[,HOST:PORT...]``
and ``etcds://HOST:PORT[,HOST:PORT...]`` (etcd over TLS).

``embedded`` alone (the CLI's default) names the store the driver runs; the driver
turns it into ``embedded://HOST:PORT`` for its workers once the server has a port.

``etcds`` is the etcd backend with TLS required: its ``StoreURL`` has the scheme
``etcd`` (the backend, what every "is this etcd?" check asks) and ``tls`` set, and it
is written back as ``etcds://``, so the URL the driver hands its workers, agents and
shards (``ELASTIC_RENDEZVOUS``) asks them for TLS too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rendezvous.errors import RendezvousConfigError

SCHEMES = ("embedded", "etcd", "etcds")
TLS_SCHEME = "etcds"  # the etcd backend, over TLS
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*|[0-9A-Fa-f:.]+")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str, where: str = "address", *, allow_port_zero: bool = False) -> Endpoint:
        """The one parser of ``HOST:PORT`` and ``[IPV6]:PORT`` (a bare IPv6 address with a
        port must be bracketed). ``allow_port_zero`` admits port 0 (bind to any free port).

        Raises:
            RendezvousConfigError: the text does not parse; the message names ``where``."""
        if not isinstance(text, str):
            raise RendezvousConfigError(f"bad endpoint {text!r} in {where}: expected HOST:PORT")
        text = text.strip()
        if text.startswith("["):
            host, sep, rest = text[1:].partition("]")
            if not sep or not rest.startswith(":"):
                raise RendezvousConfigError(
                    f"bad endpoint {text!r} in {where}: expected [IPV6]:PORT"
                )
            port_text = rest[1:]
        else:
            host, sep, port_text = text.rpartition(":")
            if not sep:
                raise RendezvousConfigError(f"bad endpoint {text!r} in {where}: expected HOST:PORT")
        if not host or (":" in host and not text.startswith("[")) or not _HOST.fullmatch(host):
            raise RendezvousConfigError(f"bad endpoint {text!r} in {where}: missing or bad host")
        low = 0 if allow_port_zero else 1
        if not re.fullmatch(r"[0-9]{1,5}", port_text) or not low <= int(port_text) < 65536:
            raise RendezvousConfigError(
                f"bad port {port_text!r} in {where}: expected a number from {low} to 65535"
            )
        return cls(host, int(port_text))

    @property
    def sockaddr(self) -> tuple[str, int]:
        """``(host, port)`` as the socket module takes it (IPv6 without brackets)."""
        return (self.host, self.port)


@dataclass(frozen=True)
class StoreURL:
    """``scheme`` names the backend ("embedded" or "etcd"); ``tls``: the URL said
    ``etcds://``, so every client of the job must speak TLS to etcd."""

    scheme: str
    endpoints: tuple[Endpoint, ...]
    tls: bool = False

    @property
    def url_scheme(self) -> str:
        """The scheme as written in the URL (``etcds`` for etcd over TLS)."""
        return TLS_SCHEME if self.tls else self.scheme

    def __str__(self) -> str:
        if not self.endpoints:
            return self.scheme
        return f"{self.url_scheme}://" + ",".join(str(e) for e in self.endpoints)


def parse_endpoint(text: str, url: str) -> Endpoint:
    """``HOST:PORT`` or ``[IPV6]:PORT`` in a store URL. Raises RendezvousConfigError
    naming ``url``."""
    return Endpoint.parse(text, f"store URL {url!r}")


def parse_store_url(url: str) -> StoreURL:
    """Raises RendezvousConfigError with a one-line reason for anything malformed."""
    if not isinstance(url, str) or not url.strip():
        raise RendezvousConfigError(
            "empty store URL: expected 'embedded', etcd://HOST:PORT[,...] or "
            "etcds://HOST:PORT[,...]"
        )
    url = url.strip()
    if url == "embedded":
        return StoreURL("embedded", ())
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise RendezvousConfigError(
            f"bad store URL {url!r}: expected 'embedded', embedded://HOST:PORT, "
            "etcd://HOST:PORT[,HOST:PORT...] or etcds://HOST:PORT[,HOST:PORT...] (TLS)"
        )
    parts = rest.rstrip("/").split(",")
    if not rest or any(not p.strip() for p in parts):
        raise RendezvousConfigError(f"bad store URL {url!r}: empty endpoint")
    endpoints = tuple(parse_endpoint(p, url) for p in parts)
    if scheme == "embedded" and len(endpoints) != 1:
        raise RendezvousConfigError(f"bad store URL {url!r}: the embedded store has one endpoint")
    if scheme == TLS_SCHEME:
        return StoreURL("etcd", endpoints, tls=True)
    return StoreURL(scheme, endpoints)
