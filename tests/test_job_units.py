"""Pure-logic tests of the driver's bookkeeping (no process, no store: the records' process
field is a stand-in, and nothing here does I/O)."""
from __future__ import annotations

from driver.config import parse_args
from driver.job import Job, WorkerRecord, job_env, worker_env
from rendezvous.plan import WorkerInfo
from rendezvous.store import KeyValue


class _NoProcess:
    rank = None


def _job_with(*worker_ids):
    job = Job(parse_args(["-np", str(max(1, len(worker_ids))), "python", "x.py"]))
    for i, wid in enumerate(worker_ids):
        job.workers[wid] = WorkerRecord(wid, "localhost", i, _NoProcess(), 0.0)
    return job


def _kv(job, wid):
    info = WorkerInfo(wid, "localhost", 0, 1, "127.0.0.1:1")
    return KeyValue(job.keys.worker(wid), info.to_json(), 1, 1, 1)


def test_registry_resync_registers_and_unregisters():
    job = _job_with("a", "b", "c")
    job.workers["b"].info = WorkerInfo("b", "localhost", 1, 1, "x:1")
    job._on_registry_resync([_kv(job, "a"), _kv(job, "c")])
    assert job.workers["a"].info is not None and job.workers["c"].info is not None
    assert job.workers["b"].info is None and job.workers["b"].unregistered_at is not None
    assert job.workers["a"].registered_seq < job.workers["c"].registered_seq


def test_worker_env_carries_the_job_and_the_worker():
    job = _job_with()
    env = worker_env(job.config, "s3cret", "embedded://h:1", "w-1", "h", 2, "127.0.0.1")
    assert env["ELASTIC_JOB_SECRET"] == "s3cret" and env["ELASTIC_WORKER_ID"] == "w-1"
    assert env["ELASTIC_SLOT"] == "2" and env["ELASTIC_RENDEZVOUS"] == "embedded://h:1"
    assert set(job_env(job.config, "s3cret", "u")) <= set(env)
