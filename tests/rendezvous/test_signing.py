"""Signed records (``rendezvous.signing``): what a client of the job writes carries the
job's signature, and what does not is ignored where it is read (get, a prefix, a watch)
and said once per kind. On both backends; on etcd a client without the secret writes
what a stranger would."""

from __future__ import annotations

import logging
import time

import pytest

from rendezvous import Compare, Put, open_store
from rendezvous.net.auth import make_secret
from rendezvous.rate_log import RateLimitedLog
from rendezvous.signing import OVERHEAD, RecordSigner, record_kind, split
from rendezvous.store import PUT
from tests.conftest import FAST

KEY = "/elastic/j1/assign/h1/w7"


def test_a_signature_binds_the_key_the_value_and_the_secret():
    signer = RecordSigner("s1")
    stored = signer.sign(KEY, b'{"term": 3}')
    assert len(stored) == len(b'{"term": 3}') + OVERHEAD
    assert signer.open(KEY, stored) == b'{"term": 3}'
    assert signer.open("/elastic/j1/assign/h1/w8", stored) is None  # copied to another id
    assert signer.open("/elastic/j2/assign/h1/w7", stored) is None  # to another job
    assert RecordSigner("s2").open(KEY, stored) is None
    body, mac = split(stored)
    assert signer.open(KEY, body.replace(b"3", b"4") + stored[len(body) :]) is None
    assert signer.open(KEY, body) is None and mac is not None  # unsigned
    assert split(b"plain") == (b"plain", None)


def test_record_kind_is_the_part_below_the_job():
    assert record_kind(KEY) == "assign"
    assert record_kind("/elastic/j1/round") == "round"
    assert record_kind("/other/thing") == "/other/thing"


def test_the_rate_limited_log_says_each_kind_once_an_interval():
    now = [0.0]
    said = RateLimitedLog(60.0, noun="records", clock=lambda: now[0])
    assert said.warn("assign", "a") and said.warn("seat", "s")
    assert not said.warn("assign", "a")
    now[0] = 61.0
    assert said.warn("assign", "a")


def _stranger(store_backend):
    """A client that writes what a process without the job's secret writes: on etcd,
    one without a secret; on the embedded store (which refuses such a client), one
    whose records carry no signature or another secret's."""
    if store_backend.name == "etcd":
        return store_backend.open(secret=None)
    client = store_backend.open()
    client.signer = RecordSigner(make_secret())
    return client


def test_what_a_stranger_writes_is_ignored_and_said(store_backend, caplog):
    job = store_backend.open(secret=store_backend.secret or "job-secret")
    stranger = _stranger(store_backend)
    prefix = "/elastic/j1/"
    watch = job.watch_prefix(prefix)
    job.put(prefix + "round", b"ours")
    stranger.put(prefix + "assign/h1/w1", b"sh -c id")
    stranger.put(prefix + "assign/h1/w2", b"sh -c id")
    stranger.put(prefix + "round", b"theirs")  # over one of ours
    job.put(prefix + "seat/w3", b"ours too")
    with caplog.at_level(logging.WARNING, logger="rendezvous.store"):
        assert job.get(prefix + "assign/h1/w1") is None
        kvs, _ = job.get_prefix(prefix)
        assert [(kv.key, kv.value) for kv in kvs] == [(prefix + "seat/w3", b"ours too")]
        seen: list[tuple[str, str, bytes]] = []
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            ev = watch.get(timeout=0.5)
            if ev is not None:
                seen.append((ev.type, ev.key, ev.value))
    watch.cancel()
    # The watch saw ours, in order, and none of the stranger's writes.
    assert seen == [(PUT, prefix + "round", b"ours"), (PUT, prefix + "seat/w3", b"ours too")]
    lines = [r.getMessage() for r in caplog.records if "does not carry" in r.getMessage()]
    # Once per kind (the round's and the assignments'), naming the key.
    assert sorted(line.split("'")[1] for line in lines) == ["assign", "round"]
    assert any(prefix + "assign/h1/w1" in line for line in lines)


def test_values_compared_are_signed_too(store_backend):
    job = store_backend.open(secret=store_backend.secret or "job-secret")
    job.put("/elastic/j1/driver", b"me")
    ours = Compare("/elastic/j1/driver", "value", "==", b"me")
    assert job.txn([ours], [Put("/elastic/j1/term", b"2")]).succeeded
    assert job.get("/elastic/j1/term").value == b"2"


def test_an_observer_without_the_secret_reads_the_records_unsigned(etcd_server):
    with (
        open_store(etcd_server.url, "job-secret", FAST) as job,
        open_store(etcd_server.url, settings=FAST) as observer,
    ):
        job.put("/elastic/j9/progress", b'{"step": 5}')
        assert observer.get("/elastic/j9/progress").value == b'{"step": 5}'
        assert job.get_unchecked("/elastic/j9/progress") == b'{"step": 5}'


@pytest.mark.parametrize("size", [1024])
def test_the_size_limit_counts_the_signature(store_backend, size):
    from dataclasses import replace

    from rendezvous.errors import ValueTooLargeError

    settings = replace(FAST, max_value_bytes=size)
    job = store_backend.open(settings, secret=store_backend.secret or "job-secret")
    job.put("/elastic/j1/x", b"x" * (size - OVERHEAD))
    with pytest.raises(ValueTooLargeError):
        job.put("/elastic/j1/x", b"x" * (size - OVERHEAD + 1))
