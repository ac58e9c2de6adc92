"""The project's and the job's identity: one version (pyproject.toml's) behind
``elastic.__version__`` and ``elastic-run --version``; console scripts that point at
real entry points; a job id that one live driver holds (a real etcd), whose keys and
lease are gone when its job ends."""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

import elastic
from driver.launch.process import STOP_GRACE
from rendezvous import open_store
from rendezvous.errors import LeaseNotFoundError
from rendezvous.keys import JobKeys
from rendezvous.schema.leader import DriverRecord
from rendezvous.version import package_version
from tests.support.jobs import ROOT, ElasticRun, check_exact_sum, exact_sum_command

SAMPLES = 400


def workload(out_dir, epochs: int, *extra: str) -> list[str]:
    return exact_sum_command(out_dir, SAMPLES, epochs, *extra)


# Read plainly (tomllib is 3.11+; the package supports 3.9).
_TEXT = (ROOT / "pyproject.toml").read_text()
_SCRIPTS = _TEXT.split("\n[project.scripts]\n", 1)[1].split("\n[", 1)[0]
VERSION = re.search(r'^version = "([^"]+)"$', _TEXT, re.MULTILINE).group(1)  # type: ignore[union-attr]
SCRIPTS = dict(re.findall(r'^([\w-]+) = "([\w.]+:\w+)"$', _SCRIPTS, re.MULTILINE))


def test_one_version_from_pyproject():
    assert elastic.__version__ == package_version() == VERSION
    assert "__version__" not in elastic.__dict__  # read when asked, not at import


def python(*args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` in the repository, as a user of this tree runs it."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_elastic_run_version():
    done = python("-m", "driver.cli", "--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"elastic-run {VERSION}"


def test_console_scripts_point_at_working_entry_points():
    assert SCRIPTS == {"elastic-run": "driver.cli:main", "elastic-plot": "runplot.__main__:main"}
    for name, target in SCRIPTS.items():
        module_name, _, function = target.partition(":")
        main = getattr(importlib.import_module(module_name), function)
        # What the installed script runs: main() with the arguments after its name.
        done = python(
            "-c",
            f"import sys; from {module_name} import {function}; sys.exit({function}(['--help']))",
        )
        assert callable(main) and done.returncode == 0, (name, done.stderr)
        assert "usage:" in done.stdout, name


# ----------------------------------------------------------------------------- the job id


def _job_args(etcd_server, job_id: str, *command: str) -> list[str]:
    return ["--rendezvous", etcd_server.url, "--job-id", job_id, *command]


def _left_in_etcd(etcd_server, job_id: str) -> list[str]:
    with open_store(etcd_server.url) as store:
        kvs, _ = store.get_prefix(JobKeys(job_id).prefix)
    return [kv.key for kv in kvs]


def _lease_gone(etcd_server, lease_id: int) -> bool:
    with open_store(etcd_server.url) as store:
        try:
            store.keepalive(lease_id, retry=False)
        except LeaseNotFoundError:
            return True
    return False


@pytest.mark.timeout(90)
def test_a_live_job_id_is_refused_and_nothing_is_left_after(tmp_path, etcd_server):
    """A second driver with a running job's id is refused with who runs it, and touches
    none of its keys; at its end the first job leaves no key and no lease behind."""
    job_id = f"t{uuid.uuid4().hex[:10]}"
    out = tmp_path / "out"
    out.mkdir()
    hold = tmp_path / "hold"
    hold.write_text("")  # the first job trains on only once the second was refused
    first = ElasticRun(
        [
            "-np",
            "2",
            *_job_args(etcd_server, job_id),
            *workload(out, 6, "--pause-while", str(hold)),
        ],
        tmp_path / "first",
    )
    with first:
        first.wait_event("round_formed")
        keys = JobKeys(job_id)
        with open_store(etcd_server.url) as store:
            kv = store.get(keys.driver)
            assert kv is not None and kv.lease
            record = DriverRecord.from_json(kv.value)
            round_before = store.get(keys.round)
        assert first.proc is not None
        driver_pid = first.proc.pid
        assert record.pid == driver_pid and record.term == 1
        second = python("-m", "driver.cli", "-np", "1", *_job_args(etcd_server, job_id), "true")
        assert second.returncode == 1
        line = second.stderr.strip().splitlines()[-1]
        assert f"job ID '{job_id}' is running: driver pid {driver_pid} on host " in line
        assert line.endswith("; pick another --job-id"), line
        with open_store(etcd_server.url) as store:  # the live job's keys are untouched
            assert store.get(keys.round) == round_before
            assert store.get(keys.driver) == kv
        hold.unlink()
        assert first.wait(timeout=60) == 0, first.stderr_tail()
    check_exact_sum(out, SAMPLES, 6, final_size=2)
    assert _left_in_etcd(etcd_server, job_id) == []
    assert _lease_gone(etcd_server, kv.lease)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("end", ["failure", "sigterm"])
def test_no_key_is_left_after_a_failed_or_stopped_job(tmp_path, etcd_server, end):
    job_id = f"t{uuid.uuid4().hex[:10]}"
    out = tmp_path / "out"
    out.mkdir()
    extra = ["--reset-limit", "0", "--min-np", "1"] if end == "failure" else []
    with ElasticRun(
        ["-np", "2", *extra, *_job_args(etcd_server, job_id), *workload(out, 200)], tmp_path
    ) as run:
        run.wait_progress(10)
        with open_store(etcd_server.url) as store:
            lease = store.get(JobKeys(job_id).driver).lease
        if end == "failure":
            run.kill_member(1)  # a re-form beyond --reset-limit 0
        else:
            run.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert run.wait(timeout=40) == (1 if end == "failure" else 128 + signal.SIGTERM)
        reason = run.events("job_failed" if end == "failure" else "job_stopped")[0]["reason"]
        assert ("reset limit" if end == "failure" else "stopped by SIGTERM") in reason
        if end == "sigterm":
            # The workers' exits reach the ending driver through their agent's reports:
            # it never waits out the grace it gives a worker that does not stop.
            assert time.monotonic() - signalled < STOP_GRACE
    assert _left_in_etcd(etcd_server, job_id) == []
    assert _lease_gone(etcd_server, lease)


@pytest.mark.timeout(60)
def test_stale_keys_of_a_dead_job_are_cleared_at_start(tmp_path, etcd_server):
    """No live driver record: whatever an earlier run of the id left is stale."""
    job_id = f"t{uuid.uuid4().hex[:10]}"
    keys = JobKeys(job_id)
    with open_store(etcd_server.url) as store:
        store.put(keys.round, b'{"round_id": 57, "members": []}')
        store.put(keys.worker("ghost"), b"{}")
    out = tmp_path / "out"
    out.mkdir()
    with ElasticRun(
        ["-np", "1", *_job_args(etcd_server, job_id), *workload(out, 2)], tmp_path
    ) as run:
        assert run.wait(timeout=50) == 0, run.stderr_tail()
        assert run.events("round_formed")[0]["round"] == 1
    check_exact_sum(out, SAMPLES, 2, final_size=1)
    assert _left_in_etcd(etcd_server, job_id) == []
