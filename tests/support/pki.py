"""A throwaway certificate authority for tests of TLS, made in the test with the
``cryptography`` package (no openssl run, nothing installed), valid for a day; and a
real etcd that serves TLS under it (``tls_etcd``)."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
from collections.abc import Iterator
from pathlib import Path

from tests.support.etcd_cluster import EtcdCluster


def write_pki(directory: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files in
    ``directory``: their paths by name ("ca"; "cert" and "key", the server's, as
    ``EtcdCluster(tls=...)`` takes them; "client_cert" and "client_key")."""
    directory.mkdir(parents=True, exist_ok=True)
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def issue(subject, key, issuer, issuer_key, ca=False, usage=None, san=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if usage:
            builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def save(stem, cert, key):
        (directory / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (directory / f"{stem}-key.pem").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        return str(directory / f"{stem}.pem"), str(directory / f"{stem}-key.pem")

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = issue("test-ca", ca_key, "test-ca", ca_key, ca=True)
    server_key, client_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    server = issue(
        "127.0.0.1",
        server_key,
        "test-ca",
        ca_key,
        usage=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client = issue("client", client_key, "test-ca", ca_key, usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    ca_path, _ = save("ca", ca, ca_key)
    server_cert, server_key_path = save("server", server, server_key)
    client_cert, client_key_path = save("client", client, client_key)
    return {
        "ca": ca_path,
        "cert": server_cert,
        "key": server_key_path,
        "client_cert": client_cert,
        "client_key": client_key_path,
    }


@contextlib.contextmanager
def tls_etcd(directory: Path) -> Iterator[tuple[EtcdCluster, dict[str, str]]]:
    """A single-member etcd that serves TLS only, under a fresh CA made in
    ``directory``, and takes only clients showing a certificate of that CA
    (``--client-cert-auth``): the cluster and ``write_pki``'s paths."""
    pki = write_pki(directory)
    with EtcdCluster(1, directory / "etcd", tls=pki) as cluster:
        yield cluster, pki


def tls_url(cluster: EtcdCluster) -> str:
    """The cluster's URL with the scheme that asks for TLS (``etcds://``)."""
    return cluster.url.replace("etcd://", "etcds://", 1)
