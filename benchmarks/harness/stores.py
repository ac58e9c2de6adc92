"""The stores a benchmark measures against, each in a process of its own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

from benchmarks.harness.paths import ROOT
from rendezvous.net.auth import ENV_SECRET, make_secret
from rendezvous.server import READY_PREFIX


@contextlib.contextmanager
def embedded_store() -> Iterator[tuple[str, str, int]]:
    """The embedded store alone in a process (``python -m rendezvous.server``), as the
    driver would be: its (address, secret, pid). Stopped on the way out.

    Raises:
        RuntimeError: the server did not say it was ready."""
    secret = make_secret()
    server = subprocess.Popen(
        [sys.executable, "-m", "rendezvous.server"],
        cwd=ROOT,
        env={**os.environ, ENV_SECRET: secret},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None  # stdout=PIPE
    try:
        line = server.stdout.readline()
        if not line.startswith(READY_PREFIX):
            raise RuntimeError(f"the embedded store did not start: {line!r}")
        yield line.split()[1], secret, server.pid
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
