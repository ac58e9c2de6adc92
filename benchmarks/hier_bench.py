"""Allreduce across test hosts: our hierarchical transport against torch gloo, and a raw
TCP transfer between the same two hosts, interleaved in one invocation.

Two test hosts (``benchmarks/harness/netns.py``: network, UTS, PID and mount namespaces
on one machine, joined by a bridge; needs root) with two worker slots each (``--slots``):
ranks 0, 1 on the first host, 2, 3 on the second. Every implementation runs as its own group of
real processes on those hosts, all alive at once (``allreduce_bench.Group``), and the
groups take turns in blocks of timed calls (``allreduce_bench.measure``):

* ``ours``: ``RingCommunicator`` with ``transport="auto"``, which picks "hier" here:
  shared memory inside each host, a TCP ring between the two host leaders;
* ``ours_tcp``: the flat TCP ring over all four members (optional, ``--impls``);
* ``gloo``: ``torch.distributed`` gloo over the hosts' bridge addresses
  (``GLOO_SOCKET_IFNAME=eth0``);
* ``raw_tcp``: one process per host swapping the array over one TCP connection, both
  directions at once: what the leaders' link carries, in each direction, during a
  two-host allreduce of the same array, with nothing else to do.

Bus bandwidth = 2(n-1)/n * bytes / time with n = 2 x slots (the same formula for both
collectives, so the ratio is the ratio of times); ``raw_tcp_GBps`` is bytes / time per
direction, and ``ours_link_fraction`` = raw time / our time: how close our allreduce
comes to the time the network alone needs to carry its bytes between the hosts.

One JSON line per configuration:
    {"bench": "hier_allreduce", "hosts", "slots", "size_mib", "dtype", "timed_calls",
     "median_ms": {...}, "busbw_GBps": {...}, "raw_tcp_GBps", "ratio_ours_gloo",
     "ours_link_fraction", "ours_transport", "load_avg"}

    sudo python -m benchmarks.hier_bench [--sizes-mib 16 64] [--blocks 5] [--iters 3]
        [--impls ours gloo raw_tcp] [--slots 2] [--ours-settings JSON]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from benchmarks.harness.allreduce import Group, available, measure, summarize
from benchmarks.harness.netns import NetnsHost, running_hosts
from benchmarks.harness.paths import ROOT

HOSTS = 2
SLOTS = 2
IMPLS = ("ours", "ours_tcp", "gloo", "raw_tcp")


def spawner(hosts: list[NetnsHost], slots: int):
    """Start rank r on host r // slots, listening on that host's address."""

    def spawn(argv: list[str], rank: int):
        host = hosts[rank // slots]
        env = dict(os.environ, PYTHONPATH=str(ROOT), GLOO_SOCKET_IFNAME="eth0")
        return host.popen([*argv, "--bind", host.address], env=env)

    return spawn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--blocks", type=int, default=5, help="interleaved turns per impl")
    ap.add_argument("--iters", type=int, default=3, help="timed calls per turn")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--impls", nargs="+", default=["ours", "gloo", "raw_tcp"], choices=IMPLS)
    ap.add_argument("--slots", type=int, default=SLOTS, help="workers per host")
    ap.add_argument("--secret", default="bench-secret")
    ap.add_argument(
        "--ours-settings", default="{}", help="JSON of extra CommSettings fields for ours"
    )
    args = ap.parse_args()
    impls = []
    for impl in args.impls:
        why = available(impl)
        if why:
            print(json.dumps({"bench": "hier_allreduce", "skipped": impl, "why": why}), flush=True)
        else:
            impls.append(impl)

    with running_hosts(HOSTS, Path(tempfile.mkdtemp(prefix="hier-bench-"))) as hosts:
        groups: dict[str, Group] = {}
        try:
            for impl in impls:
                if impl == "raw_tcp":  # one process on each host
                    groups[impl] = Group(
                        impl,
                        HOSTS,
                        args.secret,
                        spawn=spawner(list(hosts), 1),
                        control_host=hosts.gateway,
                    )
                else:
                    groups[impl] = Group(
                        impl,
                        HOSTS * args.slots,
                        args.secret,
                        args.ours_settings,
                        spawn=spawner(list(hosts), args.slots),
                        control_host=hosts.gateway,
                    )
            for mib in args.sizes_mib:
                samples = measure(groups, mib, args.blocks, args.iters, args.warmup)
                print(json.dumps(_row(groups, samples, mib, args)), flush=True)
        finally:
            for g in groups.values():
                g.close()


def _row(groups: dict[str, Group], samples: dict[str, list[float]], mib: int, args) -> dict:
    where = {"hosts": HOSTS, "slots": args.slots}
    row = summarize("hier_allreduce", where, groups, samples, mib, HOSTS * args.slots, args)
    if "raw_tcp" in samples:
        raw = statistics.median(samples["raw_tcp"])
        row["raw_tcp_GBps"] = round(mib * (1 << 20) / raw / 1e9, 3)
        if "ours" in samples:
            row["ours_link_fraction"] = round(raw / statistics.median(samples["ours"]), 3)
    row["load_avg"] = round(os.getloadavg()[0], 2)
    return row


if __name__ == "__main__":
    main()
