"""Latency of the rendezvous store: put, compare-and-swap and watch notification.

Runs both backends in one invocation (the embedded server as its own process, as the
driver would be; etcd started on free loopback ports) and prints one JSON line per
backend and operation: {"bench": "kv", "backend", "op", "n", "p50_ms", "p99_ms", "mean_ms"}.

    python -m benchmarks.kv_bench [--n 500]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness.etcd_cluster import EtcdCluster
from benchmarks.harness.stores import embedded_store
from rendezvous import open_store


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def report(backend, op, samples):
    ms = [s * 1e3 for s in samples]
    print(
        json.dumps(
            {
                "bench": "kv",
                "backend": backend,
                "op": op,
                "n": len(ms),
                "p50_ms": round(percentile(ms, 0.5), 3),
                "p99_ms": round(percentile(ms, 0.99), 3),
                "mean_ms": round(statistics.fmean(ms), 3),
            }
        ),
        flush=True,
    )


def measure(backend, url, secret, n):
    store = open_store(url, secret)
    watcher = open_store(url, secret)
    value = b"x" * 256
    for _ in range(50):  # warm-up: channels, code paths
        store.put("/bench/warm", value)

    puts = []
    for i in range(n):
        t0 = time.perf_counter()
        store.put(f"/bench/put/{i % 64}", value)
        puts.append(time.perf_counter() - t0)
    report(backend, "put", puts)

    cas = []
    rev = store.put("/bench/cas", value)
    for _ in range(n):
        t0 = time.perf_counter()
        ok = store.compare_and_swap("/bench/cas", value, rev)
        cas.append(time.perf_counter() - t0)
        assert ok
        kv = store.get("/bench/cas")
        assert kv is not None
        rev = kv.mod_revision
    report(backend, "cas", cas)

    notify = []
    watch = watcher.watch_prefix("/bench/w/")
    for i in range(n):
        t0 = time.perf_counter()
        store.put(f"/bench/w/{i}", value)
        ev = watch.get(timeout=10)
        notify.append(time.perf_counter() - t0)
        assert ev is not None and ev.key == f"/bench/w/{i}"
    watch.cancel()
    report(backend, "watch_notify", notify)
    store.close()
    watcher.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="samples per operation")
    args = parser.parse_args()

    with embedded_store() as (address, secret, _pid):
        measure("embedded", address, secret, args.n)
    with tempfile.TemporaryDirectory() as tmp, EtcdCluster(1, Path(tmp)) as cluster:
        measure("etcd", cluster.url, None, args.n)


if __name__ == "__main__":
    main()
