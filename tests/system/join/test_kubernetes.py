"""The Kubernetes manifests (``deploy/kubernetes/``): no Kubernetes runs here, so their
YAML is checked for what the cluster would need of it, and the training pod's command is
run as it is, two "pods" on this machine (each its own ``POD_NAME``, the secret from a
file as the Secret volume gives it), against a real etcd: one job, an exact end."""

from __future__ import annotations

import re
import secrets
import uuid
from pathlib import Path

import pytest
import yaml

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


def test_the_manifests_hold_together():
    etcd = one(documents("etcd.yaml"), "StatefulSet")
    assert etcd["spec"]["selector"]["matchLabels"] == etcd["spec"]["template"]["metadata"]["labels"]
    (member,) = etcd["spec"]["template"]["spec"]["containers"]
    cluster = next(a for a in member["command"] if a.startswith("--initial-cluster="))
    assert cluster.count("=http://") == etcd["spec"]["replicas"] == 3

    train = one(documents("train.yaml"), "StatefulSet")
    pod = train["spec"]["template"]
    assert train["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
    command = train_container()["command"]
    assert command[:2] == ["elastic-run", "--join"]
    endpoints = command[command.index("--rendezvous") + 1]
    assert endpoints == "etcd://" + ",".join(f"etcd-{i}.etcd:2379" for i in range(3))
    # the secret file the command reads is where the Secret volume is mounted
    secret_file = Path(command[command.index("--job-secret-file") + 1])
    (mount,) = train_container()["volumeMounts"]
    (volume,) = pod["spec"]["volumes"]
    assert mount["name"] == volume["name"] and str(secret_file.parent) == mount["mountPath"]
    assert volume["secret"]["secretName"] == "elastic-job-secret"
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 30  # the drain's grace fits


def pod_command(etcd_url: str, pod_name: str, secret_file: Path, worker: list[str]) -> list[str]:
    """The training pod's command as the kubelet runs it: $(VAR) from the container's
    env, the etcd Service's endpoints and the Secret's mount swapped for this test's,
    the user's ``python train.py`` for the exact-sum worker."""
    container = train_container()
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    env["POD_NAME"] = pod_name  # (from the pod's metadata.name)
    command = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["command"]]
    command[command.index("--rendezvous") + 1] = etcd_url
    command[command.index("--job-secret-file") + 1] = str(secret_file)
    command[command.index("--job-id") + 1] += f"-{uuid.uuid4().hex[:6]}"  # a job per test
    assert command[-2:] == ["python", "train.py"]
    return command[1:-2] + worker  # ElasticRun runs elastic-run itself


@pytest.mark.timeout(120)
def test_the_training_pods_command_trains_one_job_to_an_exact_end(tmp_path, etcd_server):
    out = tmp_path / "out"
    out.mkdir()
    secret_file = tmp_path / "secret"
    secret_file.write_text(secrets.token_hex(16))  # as the Secret volume holds it
    worker = exact_sum_command(out, SAMPLES, EPOCHS)
    first = pod_command(etcd_server.url, "elastic-train-0", secret_file, worker)
    second = first.copy()
    second[second.index("--host-name") + 1] = "elastic-train-1"
    no_secret = {"ELASTIC_JOB_SECRET": ""}
    with (
        ElasticRun(first, tmp_path / "pod0", no_secret) as pod0,
        ElasticRun(second, tmp_path / "pod1", no_secret) as pod1,
    ):
        assert pod0.wait(timeout=90) == 0, pod0.stderr_tail()
        assert pod1.wait(timeout=30) == 0, pod1.stderr_tail()
    check_exact_sum(out, SAMPLES, EPOCHS, final_size=2)
