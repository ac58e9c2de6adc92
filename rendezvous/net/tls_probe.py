"""Whether a server speaks TLS, asked with one handshake that checks no certificate.

A client that speaks TLS to a plain etcd, or plain HTTP/2 to one that wants TLS, only
ever sees its connection closed: gRPC takes that for an outage and retries until its
deadline, then says it cannot reach the store. Asked first (``speaks_tls``), the
mismatch can be said at once, naming the address (``driver.etcd_security``).
"""

from __future__ import annotations

import socket
import ssl

from rendezvous.net.url import Endpoint

PROBE_TIMEOUT = 2.0
"""Seconds one probe may take (the connection and the handshake)."""


def speaks_tls(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT) -> bool | None:
    """True when ``endpoint`` answers a TLS handshake as a TLS server does (it completes,
    or the server ends it with a TLS alert: no client certificate, say); False when it
    answers with something else, or closes the connection on the handshake's first
    message; None when it cannot be reached, or says nothing, within ``timeout``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # Only the protocol is asked: the certificate is the real client's to check.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])  # what a gRPC client offers
    try:
        raw = socket.create_connection(endpoint.sockaddr, timeout=timeout)
    except OSError:
        return None
    with raw:
        try:
            with context.wrap_socket(raw):
                return True
        except ssl.SSLEOFError:
            return False  # closed on our hello: a plain server that took it for garbage
        except ssl.SSLError as exc:
            # An alert is a TLS server refusing us; anything else (WRONG_VERSION_NUMBER:
            # the first bytes back were no TLS record) is a server of another protocol.
            return "ALERT" in (exc.reason or "")
        except socket.timeout:
            return None
        except ConnectionError:
            return False  # reset on our hello: as above
