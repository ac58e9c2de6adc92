"""Forks while gRPC is busy, as a training script's DataLoader does beside a worker's
store watches; prints one JSON line.

    python -m tests.support.fork_under_grpc FORKS

An embedded store and a client of it, a watch blocked in gRPC and two threads writing
through it; meanwhile the main thread forks ``FORKS`` children (multiprocessing's fork
context, as torch's DataLoader) that do a little work and exit. It prints
{"forks", "failed" (children that did not exit 0 within 5 s), "fork_support" (the
GRPC_ENABLE_FORK_SUPPORT gRPC saw), "store_ok" (the client still answers after)}.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading

import rendezvous
from rendezvous.backends.embedded import EmbeddedServer  # loads gRPC with its defaults


def _child() -> None:
    sum(range(10_000))


def main() -> None:
    forks = int(sys.argv[1])
    server = EmbeddedServer("fork-secret")
    store = rendezvous.open_store(f"embedded://{server.start()}", "fork-secret")
    watch = store.watch_prefix("/fork/")
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            store.put("/fork/k", str(i).encode())
            i += 1

    writers = [threading.Thread(target=write, daemon=True) for _ in range(2)]
    for t in writers:
        t.start()
    fork = multiprocessing.get_context("fork")
    failed = 0
    for _ in range(forks):
        child = fork.Process(target=_child)
        child.start()
        child.join(5)  # a healthy child is done in milliseconds
        if child.exitcode != 0:
            failed += 1
            if child.exitcode is None:
                child.kill()
                child.join()
    stop.set()
    for t in writers:
        t.join(10)
    store_ok = store.put("/fork/done", b"1") > 0 and watch.get(timeout=5) is not None
    print(
        json.dumps(
            {
                "forks": forks,
                "failed": failed,
                "fork_support": os.environ.get("GRPC_ENABLE_FORK_SUPPORT"),
                "store_ok": store_ok,
            }
        ),
        flush=True,
    )
    watch.cancel()
    store.close()
    server.stop()


if __name__ == "__main__":
    main()
