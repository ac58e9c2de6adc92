"""gRPC, loaded with the process settings it and protobuf read once, as they load
(``grpc_defaults``): the project's modules take ``grpc`` from here, never straight.
So the settings are made where gRPC is loaded and nowhere else: ``import rendezvous``
alone changes no environment variable (a process that only parses URLs or reads
records keeps the environment it was given)."""

from __future__ import annotations

import os
from collections.abc import MutableMapping


def grpc_defaults(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set, unless the user set them already, the two variables the job's gRPC needs
    before ``grpc`` or protobuf load:

    - ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``: etcd3's generated code predates
      protobuf 4 (docs/DESIGN.md, "Known trap"). The project's own services carry raw
      bytes, so only etcd's small messages pay for the slower runtime.
    - ``GRPC_ENABLE_FORK_SUPPORT=false``: gRPC's fork handlers (on in the Linux wheels)
      are skipped when another thread is inside gRPC at the fork, and the child may then
      abort in gRPC's poller ("Check failed: next_worker->state == KICKED",
      grpc/grpc#32758). A worker's store watches are always inside gRPC, and training
      scripts fork all the time (torch DataLoader workers): 39 of 300 such forks
      aborted. No child of ours uses gRPC after a fork (our own subprocesses exec at
      once), so the handlers buy nothing.

    Set in ``environ`` (the process's own by default), so the processes it starts are
    told the same."""
    environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
    environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


grpc_defaults()

import grpc  # noqa: E402  (after its settings: it reads them as it loads)
import grpc.aio  # noqa: E402

__all__ = ["grpc", "grpc_defaults"]
