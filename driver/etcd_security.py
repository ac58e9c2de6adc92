"""etcd's own security for an ``elastic-run`` job: its flags resolved into the
``ELASTIC_ETCD_*`` variables every process of the job gets, and the check, before the
job starts, that etcd speaks the protocol the URL says.

* ``etcd_environment`` (at parse time): ``--etcd-ca-cert``, ``--etcd-cert``,
  ``--etcd-key`` and ``--etcd-user`` each win over their variable; the files are made
  absolute and read once (a missing or unreadable one, a certificate without its key,
  a user without a password are one line naming the flag or the variable, exit 2:
  every worker, agent and shard would otherwise fail on it, later and far away). The
  password has no flag: it comes from ``ELASTIC_ETCD_PASSWORD`` only, since a command
  line is visible to every user of the machine. The result goes into ``elastic-run``'s
  own environment, which every process of the job inherits (locally, over ssh, srun,
  Ray), as the secret of a joined job does.
* ``check_transport`` (at start, the network's first use): one TLS handshake with the
  first etcd endpoint that answers (``rendezvous.net.tls_probe``); ``etcds://`` to a
  plain etcd, or a plain client to a TLS etcd, is one line naming the address
  (``transport_mismatch``, pure), not a 30 s wait followed by "cannot reach the store".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from driver.errors import UsageError
from rendezvous import env
from rendezvous.backends.etcd import EtcdCredentials
from rendezvous.net.tls_probe import speaks_tls
from rendezvous.net.url import TLS_SCHEME, Endpoint, StoreURL


@dataclass(frozen=True)
class Setting:
    """One of etcd's settings: its flag (``dest``: its argparse name), its variable, and
    whether it names a file."""

    flag: str
    dest: str
    variable: str
    is_file: bool


CA_CERT = Setting("--etcd-ca-cert", "etcd_ca_cert", env.ENV_ETCD_CA_CERT, True)
CERT = Setting("--etcd-cert", "etcd_cert", env.ENV_ETCD_CERT, True)
KEY = Setting("--etcd-key", "etcd_key", env.ENV_ETCD_KEY, True)
USER = Setting("--etcd-user", "etcd_user", env.ENV_ETCD_USER, False)
SETTINGS = (CA_CERT, CERT, KEY, USER)

_PEM = b"-----BEGIN "


def etcd_environment(
    given: Mapping[str, str | None], rendezvous: StoreURL, environ: Mapping[str, str]
) -> dict[str, str]:
    """The ``ELASTIC_ETCD_*`` variables this job's processes must be given (those a flag
    set: the others they inherit as they are), from the flags' values ``given`` (by
    ``Setting.dest``; None: not given), once checked with ``environ``'s.

    Raises:
        UsageError: a flag without an etcd store; a file that cannot be read or holds no
            PEM; a certificate without its key, or a key without its certificate; a
            user without a password, or a password without a user (one line naming
            the flag or the variable).
    """
    flags = {s: given.get(s.dest) for s in SETTINGS}
    if rendezvous.scheme != "etcd":
        for setting, value in flags.items():
            if value is not None:
                raise UsageError(
                    f"{setting.flag} is for an etcd store: --rendezvous etcd://HOST:PORT "
                    f"or {TLS_SCHEME}://HOST:PORT"
                )
        return {}  # (variables of the environment: another job's, ignored here)
    chosen: dict[Setting, tuple[str, str]] = {}  # the value, and what named it
    for setting, value in flags.items():
        if value:
            chosen[setting] = (_absolute(setting, value), setting.flag)
        elif environ.get(setting.variable):
            chosen[setting] = (environ[setting.variable], setting.variable)
    for first, second in ((CERT, KEY), (KEY, CERT)):
        if first in chosen and second not in chosen:
            raise UsageError(
                f"{chosen[first][1]} needs {second.flag} (or {second.variable}): a client "
                "certificate goes with its private key"
            )
    password = bool(environ.get(env.ENV_ETCD_PASSWORD))
    if USER in chosen and not password:
        raise UsageError(
            f"{chosen[USER][1]} {chosen[USER][0]} needs the user's password in "
            f"{env.ENV_ETCD_PASSWORD} (never a flag: a command line is visible to every "
            "user of the machine)"
        )
    if password and USER not in chosen:
        raise UsageError(f"{env.ENV_ETCD_PASSWORD} is set but no user: add {USER.flag}")
    for setting, (value, named) in chosen.items():
        if setting.is_file:
            _check_pem(value, named)
    return {s.variable: value for s, (value, named) in chosen.items() if named == s.flag}


def _absolute(setting: Setting, value: str) -> str:
    # Every process of the job reads it, from its own working directory.
    return os.path.abspath(value) if setting.is_file else value


def _check_pem(path: str, named: str) -> None:
    """Raises UsageError when ``path`` cannot be read or holds no PEM block."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UsageError(f"{named} {path}: cannot read it: {exc.strerror or exc}") from None
    if _PEM not in data:
        raise UsageError(f"{named} {path}: no PEM certificate or key in it")


def transport_mismatch(
    endpoints: Sequence[Endpoint], tls: bool, speaks: Callable[[Endpoint], bool | None]
) -> str | None:
    """Why a client that speaks TLS (``tls``) or not cannot talk to the etcd at
    ``endpoints``, in one line naming the endpoint; None when the first endpoint that
    answers (``speaks``: True TLS, False not, None no answer) agrees, or none answers.
    The endpoints are asked in order up to the first answer: the members of one
    cluster speak one protocol. Pure but for ``speaks``."""
    for endpoint in endpoints:
        answer = speaks(endpoint)
        if answer is None:
            continue
        if answer == tls:
            return None
        if tls:
            return (
                f"etcd at {endpoint} does not speak TLS: use etcd://{endpoint}, or serve "
                "etcd with --cert-file and --key-file (with etcd://, no --etcd-ca-cert "
                "nor --etcd-cert either: a file given means TLS)"
            )
        return (
            f"etcd at {endpoint} speaks TLS: use {TLS_SCHEME}://{endpoint} (with "
            f"{CA_CERT.flag} when its certificate is not from a CA this machine trusts, "
            f"{CERT.flag} and {KEY.flag} when it asks for a client certificate)"
        )
    return None


def check_transport(
    rendezvous: StoreURL, environ: Mapping[str, str] | None = None, speaks=speaks_tls
) -> None:
    """Refuse a job whose etcd speaks TLS where its clients would not, or the reverse
    (with ``environ``'s ``ELASTIC_ETCD_*``, as the job's clients will read them).
    Nothing for another store, or an etcd that does not answer (the store's own
    retries and errors deal with that).

    Raises:
        UsageError: the mismatch, naming ``--rendezvous`` and the address.
    """
    if rendezvous.scheme != "etcd":
        return
    environ = os.environ if environ is None else environ
    try:
        tls = EtcdCredentials.from_env(environ, tls=rendezvous.tls).tls
    except ValueError as exc:  # (RendezvousConfigError; etcd_environment said it first)
        raise UsageError(str(exc)) from None
    why = transport_mismatch(rendezvous.endpoints, tls, speaks)
    if why is not None:
        raise UsageError(f"--rendezvous {rendezvous}: {why}")
