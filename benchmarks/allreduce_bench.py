"""Allreduce bus bandwidth: ours (auto transport, and the TCP ring forced) against
torch.distributed gloo and mpi4py's Allreduce, interleaved in one invocation.

Every implementation runs as its own group of real processes, all alive at once and
idle (blocked on a control socket) while another group is measured, so the groups see
the same machine noise. For each (world size, array size) the groups take turns in
blocks of a few timed calls; each call is preceded by the implementation's own barrier,
its time is the slowest rank's, and the figure is the median over all blocks (after
warm-up calls). Bus bandwidth = 2(n-1)/n * bytes / time.

One JSON line per configuration:
    {"bench": "allreduce", "world_size", "size_mib", "dtype", "timed_calls",
     "median_ms": {...}, "busbw_GBps": {...}, "ratio_ours_gloo", "ratio_ours_tcp_gloo",
     "ratio_ours_mpi", "ours_transport", "load_avg"}

    python -m benchmarks.allreduce_bench [--worlds 2 4] [--sizes-mib 1 16 64]
        [--blocks 4] [--iters 4] [--impls ours ours_tcp gloo mpi]

gloo needs torch, the ``bench`` extra (imported only by its worker processes); MPI needs
the ``mpi`` extra (mpiexec on PATH): ``./scripts/install bench,mpi``. A missing one is
reported and skipped.

``hier_bench.py`` runs the same workers on separate test hosts (``Group``'s ``spawn`` and
``control_host``; each worker listens on its ``--bind`` address), with one more
implementation, ``raw_tcp``: two ranks that only swap their arrays over one TCP
connection, the network's own figure.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from typing import Any

from benchmarks.harness.allreduce import Group, available, measure, summarize
from benchmarks.harness.control import Line
from benchmarks.harness.processes import free_port

ALL_IMPLS = ("ours", "ours_tcp", "gloo", "mpi")
WORKER_IMPLS = (*ALL_IMPLS, "raw_tcp")


# --- worker side -----------------------------------------------------------------------


def worker_main(args) -> None:
    import numpy as np

    host, port = args.control.rsplit(":", 1)
    ctl = Line(socket.create_connection((host, int(port)), timeout=120))
    ctl.sock.settimeout(None)
    impl = args.worker
    comm: Any  # an MPI communicator or ours, by implementation
    if impl == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, world = comm.Get_rank(), comm.Get_size()
    else:
        rank, world = args.rank, args.world
    ctl.send({"rank": rank})

    if impl in ("ours", "ours_tcp"):
        from elastic.comm import CommSettings, Membership, RingCommunicator, RingListener

        listener = RingListener(args.bind, secret=args.secret)
        ctl.send({"address": listener.address})
        msg = ctl.recv()
        settings = CommSettings(
            **{
                **json.loads(args.ours_settings),
                "transport": "tcp" if impl == "ours_tcp" else "auto",
            }
        )
        comm = RingCommunicator(
            Membership(1, rank, tuple(msg["addresses"]), args.secret), listener, settings
        )
        ctl.send({"transport": comm.transport})

        def barrier():
            comm.barrier()

        def make(n):
            return np.full(n, rank + 1, dtype=np.float32)

        def allreduce(x, _out):
            return comm.allreduce(x)
    elif impl == "gloo":
        import torch
        import torch.distributed as dist

        # Rank 0 hosts gloo's store, on a port of its own address.
        ctl.send({"master": f"{args.bind}:{free_port(args.bind)}" if rank == 0 else None})
        msg = ctl.recv()
        dist.init_process_group(
            "gloo", init_method=f"tcp://{msg['master']}", rank=rank, world_size=world
        )
        ctl.send({"transport": "gloo"})

        def barrier():
            dist.barrier()

        def make(n):
            return torch.full((n,), float(rank + 1), dtype=torch.float32)

        def allreduce(x, _out):
            dist.all_reduce(x)
            return x
    elif impl == "raw_tcp":
        barrier, allreduce = _raw_tcp_pair(ctl, args.bind, rank)

        def make(n):
            return np.full(n, rank + 1, dtype=np.float32)
    else:
        ctl.send({"transport": "mpi"})

        def barrier():
            comm.Barrier()

        def make(n):
            return np.full(n, rank + 1, dtype=np.float32)

        def allreduce(x, out):
            comm.Allreduce(x, out)
            return out

    arrays: dict[int, tuple] = {}
    while True:
        msg = ctl.recv()
        if msg["cmd"] == "exit":
            break
        n = msg["mib"] * (1 << 20) // 4
        if n not in arrays:
            arrays.clear()
            arrays[n] = (make(n), np.empty(n, dtype=np.float32))
        x, out = arrays[n]
        times = []
        for i in range(msg["warmup"] + msg["iters"]):
            barrier()
            t0 = time.perf_counter()
            allreduce(x, out)
            dt = time.perf_counter() - t0
            if i >= msg["warmup"]:
                times.append(dt)
        if impl == "gloo":  # gloo reduced in place: restore the input for the next call
            x.fill_(float(rank + 1))
        ctl.send({"times": times})
    if impl in ("ours", "ours_tcp"):
        comm.close("benchmark done")
        listener.close()
    elif impl == "gloo":
        import torch.distributed as dist

        dist.destroy_process_group()


def _raw_tcp_pair(ctl: Line, bind: str, rank: int):
    """``raw_tcp``: ranks 0 and 1 joined by one TCP connection; its "allreduce" sends this
    rank's array and receives the peer's, both at once (what each link of a two-member
    ring carries in an allreduce of the same array, in each direction). Returns
    (barrier, allreduce)."""
    import threading

    from elastic.netio import recv_exact, recv_exact_into

    srv = socket.create_server((bind, 0))
    ctl.send({"address": f"{bind}:{srv.getsockname()[1]}"})
    host, port = ctl.recv()["addresses"][1 - rank].rsplit(":", 1)
    if rank == 0:
        conn = socket.create_connection((host, int(port)), timeout=60)
    else:
        srv.settimeout(60)
        conn, _ = srv.accept()
    srv.close()
    conn.settimeout(None)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ctl.send({"transport": "raw_tcp"})

    def barrier():
        conn.sendall(b"b")
        recv_exact(conn, 1)

    def allreduce(x, out):
        sender = threading.Thread(target=conn.sendall, args=(memoryview(x).cast("B"),))
        sender.start()
        recv_exact_into(conn, memoryview(out).cast("B"))
        sender.join()
        return out

    return barrier, allreduce


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=WORKER_IMPLS)
    ap.add_argument("--control")
    ap.add_argument("--bind", default="127.0.0.1", help="worker: the address it listens on")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--secret", default="bench-secret")
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--blocks", type=int, default=4, help="interleaved turns per impl")
    ap.add_argument("--iters", type=int, default=4, help="timed calls per turn")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--impls", nargs="+", default=list(ALL_IMPLS), choices=ALL_IMPLS)
    ap.add_argument(
        "--ours-settings",
        default="{}",
        help="JSON of extra CommSettings fields for ours (tuning experiments)",
    )
    args = ap.parse_args()
    if args.worker:
        worker_main(args)
        return

    impls: list[str] = []
    for impl in args.impls:
        why = available(impl)
        if why:
            print(json.dumps({"bench": "allreduce", "skipped": impl, "why": why}), flush=True)
        else:
            impls.append(impl)
    for world in args.worlds:
        groups = {}
        try:
            for impl in impls:
                groups[impl] = Group(impl, world, args.secret, args.ours_settings)
            for mib in args.sizes_mib:
                samples = measure(groups, mib, args.blocks, args.iters, args.warmup)
                row = summarize(
                    "allreduce", {"world_size": world}, groups, samples, mib, world, args
                )
                row["load_avg"] = round(os.getloadavg()[0], 2)
                print(json.dumps(row), flush=True)
        finally:
            for g in groups.values():
                g.close()


if __name__ == "__main__":
    main()
