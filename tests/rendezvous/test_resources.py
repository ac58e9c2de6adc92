"""The process-wide limits a server keeps (``rendezvous.resources``) and the gRPC caps
made from them (``ServerLimits.grpc_options``). Descriptor limits are changed in a child
process: the test process keeps its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rendezvous.net.rpc import ServerLimits
from rendezvous.resources import release_free_memory
from tests.support.paths import ROOT

_CHILD = """
import json, resource, sys
from rendezvous.net.rpc import ServerLimits
from rendezvous.resources import connection_cap, raise_fd_limit
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
raised = raise_fd_limit(int(sys.argv[3]))
print(json.dumps({
    "raised": raised,
    "again": raise_fd_limit(raised // 2),
    "cap": connection_cap(10**6),
    "small": connection_cap(3),
    "grpc": dict(ServerLimits().grpc_options()),
}))
"""


def _limits_in_child(soft: int, hard: int, ceiling: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(soft), str(hard), str(ceiling)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("soft", "hard", "ceiling", "raised"),
    [(256, 2048, 1 << 16, 2048), (256, 2048, 1000, 1000), (1024, 1024, 1 << 16, 1024)],
)
def test_the_soft_limit_is_raised_to_the_hard_one_and_never_lowered(soft, hard, ceiling, raised):
    got = _limits_in_child(soft, hard, ceiling)
    assert got["raised"] == raised
    assert got["again"] == raised  # a lower ceiling later does not lower it


def test_a_server_holds_at_most_half_the_descriptors():
    got = _limits_in_child(1024, 1024, 1 << 16)
    assert got["cap"] == 512 and got["small"] == 3
    grpc = got["grpc"]
    assert grpc["grpc.max_allowed_incoming_connections"] == 512
    limits = ServerLimits()
    assert grpc["grpc.max_connection_idle_ms"] == limits.idle_timeout * 1000
    assert grpc["grpc.max_connection_age_ms"] == limits.max_connection_age * 1000
    assert grpc["grpc.max_concurrent_streams"] == limits.max_streams_per_connection


@pytest.mark.parametrize(
    "bad",
    [
        {"max_connections": 0},
        {"idle_timeout": 0},
        {"max_connection_age": -1},
        {"age_grace": 0},
        {"max_metadata_bytes": 10},
    ],
)
def test_unusable_server_limits_are_refused(bad):
    with pytest.raises(ValueError, match="unusable server limits"):
        ServerLimits(**bad)


def test_free_memory_is_handed_back():
    assert release_free_memory() is True
