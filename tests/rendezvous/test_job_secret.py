"""``check_job_secret`` against a real etcd: a process holding another secret than the
one the job's leader runs with is told so in one line (etcd itself never checks it)."""

from __future__ import annotations

import uuid

import pytest

from rendezvous import open_store
from rendezvous.errors import RendezvousAuthError
from rendezvous.job_secret import check_job_secret
from rendezvous.keys import JobKeys
from rendezvous.net.auth import secret_fingerprint
from rendezvous.schema.leader import DriverStateRecord


def test_another_secret_than_the_leaders_is_named_in_one_line(etcd_server):
    keys = JobKeys(f"s{uuid.uuid4().hex[:10]}")
    store = open_store(etcd_server.url)
    try:
        check_job_secret(store, keys, "any")  # no job yet: nothing to compare with
        state = DriverStateRecord(term=1, secret_id=secret_fingerprint("the-jobs"))
        store.put(keys.driver_state, state.to_json())
        check_job_secret(store, keys, "the-jobs")
        with pytest.raises(RendezvousAuthError, match="ELASTIC_JOB_SECRET is not the secret"):
            check_job_secret(store, keys, "another")
    finally:
        store.close()
