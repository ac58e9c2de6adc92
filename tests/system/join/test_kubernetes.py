"""The Kubernetes manifests (``deploy/kubernetes/``): no Kubernetes runs here, so their
YAML is checked for what the cluster would need of it, and the training pod's command is
run as it is, two "pods" on this machine (each its own ``POD_NAME``, the secret and the
etcd client certificate from files as the Secret volumes give them), against a real etcd
that serves TLS with the certificates etcd.yaml's recipe makes (its openssl commands, run
as written): one job, an exact end."""

from __future__ import annotations

import re
import secrets
import shlex
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from tests.support.etcd_cluster import EtcdCluster
from tests.support.jobs import ElasticRun, check_exact_sum, exact_sum_command
from tests.support.paths import ROOT

pytestmark = pytest.mark.system

DEPLOY = ROOT / "deploy" / "kubernetes"
SAMPLES, EPOCHS = 1200, 6


def documents(name: str) -> list[dict]:
    with open(DEPLOY / name) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(docs: list[dict], kind: str) -> dict:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def train_container() -> dict:
    (container,) = one(documents("train.yaml"), "StatefulSet")["spec"]["template"]["spec"][
        "containers"
    ]
    return container


def flag_value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


ETCD_FILE_FLAGS = ("--etcd-ca-cert", "--etcd-cert", "--etcd-key")


def recipe_commands() -> list[str]:
    """The openssl commands of etcd.yaml's opening comment, as a shell runs them (a
    line ending in a backslash goes on on the next)."""
    lines = []
    for raw in (DEPLOY / "etcd.yaml").read_text().splitlines():
        if not raw.startswith("#"):
            break
        lines.append(raw[1:].strip())
    commands, current = [], ""
    for line in lines:
        current = f"{current} {line}".strip() if current else line
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        if current.startswith("openssl "):
            commands.append(current)
        current = ""
    return commands


def test_the_manifests_hold_together():
    etcd = one(documents("etcd.yaml"), "StatefulSet")
    assert etcd["spec"]["selector"]["matchLabels"] == etcd["spec"]["template"]["metadata"]["labels"]
    (member,) = etcd["spec"]["template"]["spec"]["containers"]
    cluster = next(a for a in member["command"] if a.startswith("--initial-cluster="))
    assert cluster.count("=https://") == etcd["spec"]["replicas"] == 3
    # TLS for clients and peers, and only clients with a certificate of the job's CA
    flags = {a.split("=", 1)[0]: a.partition("=")[2] for a in member["command"][1:]}
    assert flags["--listen-client-urls"].startswith("https://")
    assert "--client-cert-auth" in flags and "--peer-client-cert-auth" in flags
    (_data, tls) = member["volumeMounts"]
    tls_files = [flags[f] for f in ("--cert-file", "--key-file", "--trusted-ca-file")]
    assert all(str(Path(f).parent) == tls["mountPath"] for f in tls_files)
    (volume,) = etcd["spec"]["template"]["spec"]["volumes"]
    assert volume["name"] == tls["name"] and volume["secret"]["secretName"] == "etcd-server-tls"

    train = one(documents("train.yaml"), "StatefulSet")
    pod = train["spec"]["template"]
    assert train["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
    command = train_container()["command"]
    assert command[:2] == ["elastic-run", "--join"]
    endpoints = flag_value(command, "--rendezvous")
    assert endpoints == "etcds://" + ",".join(f"etcd-{i}.etcd:2379" for i in range(3))
    # each file the command reads is where its Secret volume is mounted
    mounts = {m["mountPath"]: m["name"] for m in train_container()["volumeMounts"]}
    volumes = {v["name"]: v["secret"]["secretName"] for v in pod["spec"]["volumes"]}
    for flag, secret in (
        ("--job-secret-file", "elastic-job-secret"),
        *((f, "etcd-client-tls") for f in ETCD_FILE_FLAGS),
    ):
        assert volumes[mounts[str(Path(flag_value(command, flag)).parent)]] == secret, flag
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 30  # the drain's grace fits


def test_the_recipe_makes_every_file_the_secrets_hold():
    text = (DEPLOY / "etcd.yaml").read_text()
    made = {w for c in recipe_commands() for w in shlex.split(c) if w.endswith((".crt", ".key"))}
    assert {"ca.crt", "server.crt", "server.key", "client.crt", "client.key"} <= made
    for secret in re.findall(r"kubectl create secret generic [^\n]*(?:\n#\s+--[^\n]*)*", text):
        for name in re.findall(r"--from-file=(\S+)", secret):
            assert name in made, name


def pod_command(
    etcd_url: str, pod_name: str, secret_file: Path, tls_dir: Path, worker: list[str]
) -> list[str]:
    """The training pod's command as the kubelet runs it: $(VAR) from the container's
    env, the etcd Service's endpoints and the Secrets' mounts swapped for this test's
    (``tls_dir``: where the client certificate's files are), the user's
    ``python train.py`` for the exact-sum worker."""
    container = train_container()
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    env["POD_NAME"] = pod_name  # (from the pod's metadata.name)
    command = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["command"]]
    command[command.index("--rendezvous") + 1] = etcd_url
    command[command.index("--job-secret-file") + 1] = str(secret_file)
    for flag in ETCD_FILE_FLAGS:
        index = command.index(flag) + 1
        command[index] = str(tls_dir / Path(command[index]).name)
    command[command.index("--job-id") + 1] += f"-{uuid.uuid4().hex[:6]}"  # a job per test
    assert command[-2:] == ["python", "train.py"]
    return command[1:-2] + worker  # ElasticRun runs elastic-run itself


@pytest.fixture
def recipe_etcd(tmp_path):
    """A real etcd serving TLS with the certificates etcd.yaml's recipe makes, run as
    written in ``tls/``: the cluster and that folder."""
    tls = tmp_path / "tls"
    tls.mkdir()
    for command in recipe_commands():
        done = subprocess.run(
            ["bash", "-c", command], cwd=tls, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, f"{command}: {done.stderr}"
    files = {"cert": "server.crt", "key": "server.key", "ca": "ca.crt"}
    files.update(client_cert="client.crt", client_key="client.key")
    with EtcdCluster(1, tmp_path / "etcd", tls={k: str(tls / v) for k, v in files.items()}) as c:
        yield c, tls


@pytest.mark.timeout(120)
def test_the_training_pods_command_trains_one_job_to_an_exact_end(tmp_path, recipe_etcd):
    cluster, tls = recipe_etcd
    out = tmp_path / "out"
    out.mkdir()
    secret_file = tmp_path / "secret"
    secret_file.write_text(secrets.token_hex(16))  # as the Secret volume holds it
    worker = exact_sum_command(out, SAMPLES, EPOCHS)
    url = cluster.url.replace("etcd://", "etcds://", 1)
    first = pod_command(url, "elastic-train-0", secret_file, tls, worker)
    second = first.copy()
    second[second.index("--host-name") + 1] = "elastic-train-1"
    # The pod's environment holds neither the job's secret nor etcd's files: its flags do.
    bare = dict.fromkeys(
        ("ELASTIC_JOB_SECRET", "ELASTIC_ETCD_CA_CERT", "ELASTIC_ETCD_CERT", "ELASTIC_ETCD_KEY"),
        "",
    )
    with (
        ElasticRun(first, tmp_path / "pod0", bare) as pod0,
        ElasticRun(second, tmp_path / "pod1", bare) as pod1,
    ):
        assert pod0.wait(timeout=90) == 0, pod0.stderr_tail()
        assert pod1.wait(timeout=30) == 0, pod1.stderr_tail()
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
