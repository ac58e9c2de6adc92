"""etcd's security flags of elastic-run (``driver.etcd_security``): what each sets for the
job's processes, bad input in one line naming the flag or variable, and the words for
an etcd that speaks TLS where the URL does not (the decision, given the answers)."""

from __future__ import annotations

import os
import re

import pytest

from driver.config import parse_args
from driver.errors import UsageError
from driver.etcd_security import etcd_environment, transport_mismatch
from rendezvous.net.url import Endpoint, parse_store_url

ETCD = parse_store_url("etcd://e1:2379,e2:2379")
VARIABLES = (
    "ELASTIC_ETCD_USER",
    "ELASTIC_ETCD_PASSWORD",
    "ELASTIC_ETCD_CA_CERT",
    "ELASTIC_ETCD_CERT",
    "ELASTIC_ETCD_KEY",
)


@pytest.fixture(autouse=True)
def no_etcd_variables(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def pem(tmp_path):
    """A file that holds a PEM block, by name (its content is not checked further)."""

    def make(name: str) -> str:
        path = tmp_path / name
        path.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
        return str(path)

    return make


def environment(environ=None, url=ETCD, **given) -> dict[str, str]:
    return etcd_environment(given, url, environ or {})


def test_each_flag_sets_its_variable_for_the_job_with_an_absolute_path(pem, monkeypatch):
    ca, cert, key = pem("ca.pem"), pem("c.pem"), pem("k.pem")
    monkeypatch.chdir(os.path.dirname(ca))
    got = environment(
        {"ELASTIC_ETCD_PASSWORD": "pw"},
        etcd_ca_cert="ca.pem",  # relative: every process reads it from its own cwd
        etcd_cert=cert,
        etcd_key=key,
        etcd_user="trainer",
    )
    assert got == {
        "ELASTIC_ETCD_CA_CERT": ca,
        "ELASTIC_ETCD_CERT": cert,
        "ELASTIC_ETCD_KEY": key,
        "ELASTIC_ETCD_USER": "trainer",
    }


def test_a_flag_wins_over_its_variable_and_the_variables_alone_are_checked_too(pem, tmp_path):
    ca = pem("ca.pem")
    assert environment({"ELASTIC_ETCD_CA_CERT": "/old/ca.pem"}, etcd_ca_cert=ca) == {
        "ELASTIC_ETCD_CA_CERT": ca
    }
    # Nothing to set when the variables say it all; a bad one is named as a variable.
    assert environment({"ELASTIC_ETCD_CA_CERT": ca}) == {}
    missing = str(tmp_path / "gone.pem")
    with pytest.raises(
        UsageError, match=re.escape(f"ELASTIC_ETCD_CA_CERT {missing}: cannot read it")
    ):
        environment({"ELASTIC_ETCD_CA_CERT": missing})


@pytest.mark.parametrize(
    "environ,given,message",
    [
        ({}, {"etcd_cert": "C"}, "--etcd-cert needs --etcd-key (or ELASTIC_ETCD_KEY)"),
        ({}, {"etcd_key": "K"}, "--etcd-key needs --etcd-cert (or ELASTIC_ETCD_CERT)"),
        ({"ELASTIC_ETCD_CERT": "C"}, {}, "ELASTIC_ETCD_CERT needs --etcd-key"),
        ({}, {"etcd_user": "root"}, "--etcd-user root needs the user's password in "),
        ({"ELASTIC_ETCD_PASSWORD": "pw"}, {}, "ELASTIC_ETCD_PASSWORD is set but no user"),
    ],
)
def test_half_a_credential_is_one_line_naming_what_is_missing(environ, given, message, pem):
    resolved = {k: pem(f"{v}.pem") if k != "etcd_user" else v for k, v in given.items()}
    named = {k: pem(f"{v}.pem") for k, v in environ.items() if k.endswith(("CERT", "KEY"))}
    with pytest.raises(UsageError) as caught:
        environment({**environ, **named}, **resolved)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_file_is_read_once_at_the_start(tmp_path, pem):
    with pytest.raises(UsageError, match=r"--etcd-ca-cert .*nope\.pem: cannot read it: No such"):
        environment(etcd_ca_cert=str(tmp_path / "nope.pem"))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(UsageError, match=r"garbage\.pem: no PEM certificate or key in it"):
        environment(etcd_ca_cert=str(garbage))


def test_the_flags_need_an_etcd_store_and_another_stores_variables_are_ignored(pem):
    embedded = parse_store_url("embedded")
    with pytest.raises(UsageError, match="--etcd-ca-cert is for an etcd store"):
        environment(url=embedded, etcd_ca_cert=pem("ca.pem"))
    assert environment({"ELASTIC_ETCD_CERT": "/x.pem"}, url=embedded) == {}


def test_parse_args_carries_them_and_the_password_has_no_flag(pem, monkeypatch):
    monkeypatch.setenv("ELASTIC_ETCD_PASSWORD", "pw")
    ca = pem("ca.pem")
    config = parse_args(
        ["--rendezvous", "etcds://e:1", "--etcd-ca-cert", ca, "--etcd-user", "u", "-np", "1", "t"]
    )
    assert config.rendezvous.tls and str(config.rendezvous) == "etcds://e:1"
    assert dict(config.etcd_env) == {"ELASTIC_ETCD_CA_CERT": ca, "ELASTIC_ETCD_USER": "u"}
    with pytest.raises(UsageError, match="unrecognized arguments: --etcd-password"):
        parse_args(["--rendezvous", "etcd://e:1", "--etcd-password", "pw", "-np", "1", "t"])


# ----------------------------------------------------------------------------- the protocol

A, B = Endpoint("a", 1), Endpoint("b", 2)


def test_a_tls_client_to_a_plain_etcd_names_the_address_and_the_scheme_to_use():
    why = transport_mismatch((A,), True, {A: False}.get)
    assert why is not None and why.startswith("etcd at a:1 does not speak TLS: use etcd://a:1")


def test_a_plain_client_to_a_tls_etcd_names_etcds_and_the_flags():
    why = transport_mismatch((A,), False, {A: True}.get)
    assert why is not None and "speaks TLS: use etcds://a:1" in why and "--etcd-ca-cert" in why


def test_the_first_endpoint_that_answers_decides_and_silence_says_nothing():
    asked = []

    def speaks(endpoint):
        asked.append(endpoint)
        return {A: None, B: True}[endpoint]

    assert transport_mismatch((A, B), True, speaks) is None and asked == [A, B]
    assert transport_mismatch((A,), True, lambda e: None) is None  # unreachable: not ours
    assert transport_mismatch((B, A), True, speaks) is None and asked[-1] == B
