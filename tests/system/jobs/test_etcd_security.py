"""Whole jobs on an etcd that checks who calls: over TLS with a client certificate
(``etcds://`` and the ``--etcd-*`` flags alone, no ELASTIC_ETCD_* in the environment:
every agent, worker and ps shard must get them from the driver), and with an etcd user and its
password; and the one line, exit 2, of a URL whose protocol is not the server's."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests.support.jobs import ROOT, ElasticRun, check_exact_sum, exact_sum_command
from tests.support.pki import tls_etcd, tls_url

pytestmark = pytest.mark.system

SAMPLES, EPOCHS = 400, 4
ETCD_VARIABLES = (
    "ELASTIC_ETCD_USER",
    "ELASTIC_ETCD_PASSWORD",
    "ELASTIC_ETCD_CA_CERT",
    "ELASTIC_ETCD_CERT",
    "ELASTIC_ETCD_KEY",
)
NO_ETCD_VARIABLES = dict.fromkeys(ETCD_VARIABLES, "")  # (empty: unset, to the readers)


def _job_id() -> str:
    return f"sec-{uuid.uuid4().hex[:8]}"


def _refused(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """elastic-run with ``args`` (and ``env`` over the test's environment) that must be
    refused before any job starts."""
    return subprocess.run(
        [sys.executable, "-m", "driver.cli", *args, "-np", "1", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **NO_ETCD_VARIABLES, **(env or {})},
    )


@pytest.fixture
def tls_cluster(tmp_path):
    with tls_etcd(tmp_path / "pki") as (cluster, pki):
        yield cluster, pki


@pytest.mark.timeout(120)
def test_a_job_on_etcd_over_tls_from_the_flags_alone_ends_exact(tmp_path, tls_cluster):
    cluster, pki = tls_cluster
    out = tmp_path / "out"
    out.mkdir()
    args = [
        *("--rendezvous", tls_url(cluster), "--job-id", _job_id()),
        *("--etcd-ca-cert", pki["ca"]),
        *("--etcd-cert", pki["client_cert"], "--etcd-key", pki["client_key"]),
        # a ps shard too: it serves only once its record is in the store, over TLS
        *("--num-ps", "1", "-np", "2", *exact_sum_command(out, SAMPLES, EPOCHS)),
    ]
    with ElasticRun(args, tmp_path / "run", NO_ETCD_VARIABLES) as run:
        assert run.wait(timeout=90) == 0, run.stderr_tail()
        assert [e["shard"] for e in run.events("ps_started")] == [0]
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)


@pytest.mark.timeout(60)
def test_a_url_whose_protocol_is_not_the_servers_is_one_line_naming_it(tls_cluster, etcd_server):
    cluster, _ = tls_cluster
    (address,) = cluster.url.split("://")[1].split(",")
    plain = _refused(["--rendezvous", cluster.url])
    assert plain.returncode == 2, plain.stderr
    assert plain.stderr.strip().splitlines() == [
        f"elastic-run: error: --rendezvous {cluster.url}: etcd at {address} speaks TLS: use "
        f"etcds://{address} (with --etcd-ca-cert when its certificate is not from a CA this "
        "machine trusts, --etcd-cert and --etcd-key when it asks for a client certificate)"
    ]
    (plain_address,) = etcd_server.url.split("://")[1].split(",")
    tls = _refused(["--rendezvous", f"etcds://{plain_address}"])
    assert tls.returncode == 2, tls.stderr
    (line,) = tls.stderr.strip().splitlines()
    assert f"etcd at {plain_address} does not speak TLS: use etcd://{plain_address}" in line


@pytest.mark.timeout(120)
def test_a_job_as_an_etcd_user_with_the_password_from_the_environment_ends_exact(
    tmp_path, etcd_single
):
    etcd_single.enable_auth("s3cret")
    out = tmp_path / "out"
    out.mkdir()
    args = [
        *("--rendezvous", etcd_single.url, "--job-id", _job_id(), "--etcd-user", "root"),
        *("-np", "2", *exact_sum_command(out, SAMPLES, EPOCHS)),
    ]
    env = {**NO_ETCD_VARIABLES, "ELASTIC_ETCD_PASSWORD": "s3cret"}
    with ElasticRun(args, tmp_path / "run", env) as run:
        assert run.wait(timeout=90) == 0, run.stderr_tail()
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
    # A wrong password is a setting that does not hold, as a missing one is: one line
    # naming the user and the address, exit 2, before any job starts.
    login = ["--rendezvous", etcd_single.url, "--job-id", _job_id(), "--etcd-user", "root"]
    wrong = _refused(login, {"ELASTIC_ETCD_PASSWORD": "not-it", "ELASTIC_JOB_SECRET": "s" * 64})
    assert wrong.returncode == 2, wrong.stderr
    (line,) = wrong.stderr.strip().splitlines()
    address = etcd_single.url.split("//")[1]
    assert "--etcd-user" in line and "'root'" in line and address in line, line
