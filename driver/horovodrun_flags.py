"""``horovodrun``'s flags on ``elastic-run`` (``add_horovodrun_flags``), so that a Horovod
user's command line works with ``horovodrun`` replaced by ``elastic-run``.

* The flags that mean what ours mean are ours already, under horovodrun's names where
  they differ: ``--num-proc`` (``-np``), ``--min-num-proc``/``--max-num-proc``,
  ``--network-interfaces`` (one interface: we advertise one address).
* The others are refused at once, in one line that says what to do instead: a flag
  taken and ignored would let a user believe a setting holds that does not.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from driver.errors import UsageError

_FUSION = "elastic-run fuses small tensors by itself (elastic.torch's buckets): drop it"
_AUTOTUNE = "elastic-run has no autotuning: drop it"
_STALL = "a silent peer is found by the ring's heartbeats (ELASTIC_PEER_TIMEOUT): drop it"
_CONTROLLER = "elastic-run runs its own ring, with no MPI or Gloo controller: drop it"
_TIMELINE = "--events FILE records the job's events, and elastic-plot FILE draws them"

REFUSED: dict[tuple[str, ...], tuple[int, str]] = {
    ("--gloo",): (0, _CONTROLLER),
    ("--mpi",): (0, _CONTROLLER),
    ("--jsrun",): (0, _CONTROLLER),
    ("--mpi-args",): (1, _CONTROLLER),
    ("--binding-args",): (1, _CONTROLLER),
    ("--mpi-threads-disable",): (0, _CONTROLLER),
    ("--tcp",): (0, "elastic-run's ring runs over TCP (shared memory within a host): drop it"),
    ("-hostfile", "--hostfile"): (
        1,
        "list the hosts with -H HOST:SLOTS,... or print them from --host-discovery-script",
    ),
    ("-p", "--ssh-port"): (1, "set ELASTIC_SSH_OPTIONS='-p PORT' (extra ssh arguments)"),
    ("-i", "--ssh-identity-file"): (
        1,
        "set ELASTIC_SSH_OPTIONS='-i FILE' (extra ssh arguments)",
    ),
    ("--fusion-threshold-mb",): (1, _FUSION),
    ("--cycle-time-ms",): (1, _FUSION),
    ("--cache-capacity",): (1, _FUSION),
    ("--hierarchical-allreduce",): (
        0,
        "the ring goes through each host's shared memory by itself: drop it",
    ),
    ("--no-hierarchical-allreduce",): (
        0,
        "the ring goes through each host's shared memory by itself: drop it",
    ),
    ("--hierarchical-allgather",): (
        0,
        "the ring goes through each host's shared memory by itself: drop it",
    ),
    ("--no-hierarchical-allgather",): (
        0,
        "the ring goes through each host's shared memory by itself: drop it",
    ),
    ("--autotune",): (0, _AUTOTUNE),
    ("--autotune-log-file",): (1, _AUTOTUNE),
    ("--autotune-warmup-samples",): (1, _AUTOTUNE),
    ("--autotune-steps-per-sample",): (1, _AUTOTUNE),
    ("--autotune-bayes-opt-max-samples",): (1, _AUTOTUNE),
    ("--autotune-gaussian-process-noise",): (1, _AUTOTUNE),
    ("--timeline-filename",): (1, _TIMELINE),
    ("--timeline-mark-cycles",): (0, _TIMELINE),
    ("--no-stall-check",): (0, _STALL),
    ("--stall-check-warning-time-seconds",): (1, _STALL),
    ("--stall-check-shutdown-time-seconds",): (1, _STALL),
    ("--gloo-timeout-seconds",): (1, _STALL),
    ("--num-nccl-streams",): (1, "elastic-run moves tensors on its CPU ring: drop it"),
    ("--thread-affinity",): (1, "elastic-run pins no thread: drop it"),
    ("--log-level",): (1, "-v says more (repeat it for more)"),
    ("--log-without-timestamp",): (0, "elastic-run's own lines carry a timestamp: drop it"),
    ("-prefix-timestamp", "--prefix-output-with-timestamp"): (
        0,
        "elastic-run prefixes each worker line with its rank and host: drop it",
    ),
    ("--output-filename",): (1, "--log-dir DIR writes each worker's output to a file there"),
    ("--config-file",): (1, "give the flags on the command line"),
    ("--disable-cache",): (0, "elastic-run caches no host checks: drop it"),
    ("-cb", "--check-build"): (0, "elastic.horovod.nccl_built() and friends say it in Python"),
}
"""horovodrun's flags ``elastic-run`` does not have: the values each takes, and what to do
instead (said in the one-line error)."""


class _Refused(argparse.Action):
    """A horovodrun flag we do not have: a ``UsageError`` naming it and what to do."""

    def __init__(self, option_strings: Sequence[str], dest: str, hint: str, **kwargs: Any):
        super().__init__(option_strings, dest=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
        self.hint = hint

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        raise UsageError(
            f"{option_string} is horovodrun's, elastic-run has no such flag: {self.hint}"
        )


def _one_interface(text: str) -> str:
    """``--network-interfaces NICS`` with one name (we advertise a single address)."""
    names = [n for n in text.split(",") if n]
    if len(names) != 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: elastic-run advertises one interface's address; give one name"
        )
    return names[0]


def add_horovodrun_flags(parser: argparse.ArgumentParser) -> None:
    """The refused flags (hidden from ``--help``), and ``--network-interfaces`` as one
    interface into ``network_interface``. (``--num-proc``, ``--min-num-proc``,
    ``--max-num-proc`` and ``--hosts`` are aliases where ours are defined.)"""
    for flags, (values, hint) in REFUSED.items():
        parser.add_argument(*flags, action=_Refused, hint=hint, nargs=values or 0)
    parser.add_argument(
        "--network-interfaces",
        dest="network_interface",
        type=_one_interface,
        help=argparse.SUPPRESS,
    )
