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

    python benchmarks/allreduce_bench.py [--worlds 2 4] [--sizes-mib 1 16 64]
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
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ALL_IMPLS = ("ours", "ours_tcp", "gloo", "mpi")
WORKER_IMPLS = (*ALL_IMPLS, "raw_tcp")


# --- control channel (JSON lines over TCP), shared by parent and workers -----------


class Line:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.f = sock.makefile("rwb")

    def send(self, obj) -> None:
        self.f.write(json.dumps(obj).encode() + b"\n")
        self.f.flush()

    def recv(self):
        line = self.f.readline()
        if not line:
            raise EOFError("control connection closed")
        return json.loads(line)


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


# --- parent side -----------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


Spawn = Callable[[list[str], int], subprocess.Popen]
"""``spawn(argv, rank)``: start rank ``rank``'s worker (``argv`` without ``--bind``)."""


def spawn_here(argv: list[str], rank: int) -> subprocess.Popen:
    return subprocess.Popen(argv, env=dict(os.environ, PYTHONPATH=str(ROOT)))


class Group:
    """One implementation's worker processes and their control connections, started by
    ``spawn`` (here by default); they reach this process at ``control_host``."""

    def __init__(
        self,
        impl: str,
        world: int,
        secret: str,
        ours_settings: str = "{}",
        *,
        spawn: Spawn = spawn_here,
        control_host: str = "127.0.0.1",
    ):
        self.impl = impl
        self.world = world
        self.procs: list[subprocess.Popen] = []
        self.lines: list[Line] = []
        srv = socket.socket()
        srv.bind((control_host, 0))
        srv.listen(world)
        srv.settimeout(120)
        control = f"{control_host}:{srv.getsockname()[1]}"
        me = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            impl,
            "--control",
            control,
            "--secret",
            secret,
            "--ours-settings",
            ours_settings,
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        try:
            if impl == "mpi":
                self.procs.append(
                    subprocess.Popen(
                        [shutil.which("mpiexec") or "mpiexec", "-n", str(world), *me], env=env
                    )
                )
            else:
                for r in range(world):
                    self.procs.append(spawn(me + ["--rank", str(r), "--world", str(world)], r))
            by_rank: dict[int, Line] = {}
            for _ in range(world):
                conn, _ = srv.accept()
                conn.settimeout(600)
                line = Line(conn)
                by_rank[line.recv()["rank"]] = line
            self.lines = [by_rank[r] for r in range(world)]
        finally:
            srv.close()
        if impl in ("ours", "ours_tcp", "raw_tcp"):
            addresses = [ln.recv()["address"] for ln in self.lines]
            for ln in self.lines:
                ln.send({"addresses": addresses})
        elif impl == "gloo":
            masters = [ln.recv()["master"] for ln in self.lines]  # every rank answers
            for ln in self.lines:
                ln.send({"master": masters[0]})
        transports = [ln.recv()["transport"] for ln in self.lines]  # every rank answers
        self.transport = transports[0]

    def run(self, mib: int, iters: int, warmup: int) -> list[float]:
        """Per timed call, the slowest rank's seconds."""
        for ln in self.lines:
            ln.send({"cmd": "run", "mib": mib, "iters": iters, "warmup": warmup})
        per_rank = [ln.recv()["times"] for ln in self.lines]
        return [max(ts) for ts in zip(*per_rank)]

    def close(self) -> None:
        for ln in self.lines:
            with contextlib.suppress(OSError, AttributeError):
                ln.send({"cmd": "exit"})
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def available(impl: str) -> str | None:
    """None when ``impl`` can run here, else why not."""
    try:
        if impl == "gloo":
            import importlib.util

            if importlib.util.find_spec("torch") is None:
                return "torch is not installed (./scripts/install bench)"
        if impl == "mpi":
            import importlib.util

            if importlib.util.find_spec("mpi4py") is None or not shutil.which("mpiexec"):
                return "mpi4py/mpiexec missing (./scripts/install mpi)"
    except Exception as e:  # noqa: BLE001 - report and skip
        return str(e)
    return None


def measure(
    groups: dict[str, Group], mib: int, blocks: int, iters: int, warmup: int
) -> dict[str, list[float]]:
    """Every group's timed calls of ``mib`` MiB (the slowest rank's seconds each), taken in
    ``blocks`` interleaved turns of ``iters`` calls (``warmup`` more in the first)."""
    impls = list(groups)
    samples: dict[str, list[float]] = {impl: [] for impl in impls}
    for block in range(blocks):
        # Rotate the order so no implementation always runs right after the same
        # neighbour (cache and scheduler state).
        order = impls[block % len(impls) :] + impls[: block % len(impls)]
        for impl in order:
            samples[impl] += groups[impl].run(mib, iters, warmup if block == 0 else 0)
    return samples


def summarize(
    bench: str,
    where: dict,
    groups: dict[str, Group],
    samples: dict[str, list[float]],
    mib: int,
    world: int,
    args,
) -> dict:
    """One configuration's JSON row: ``where`` it ran, median times, the bus bandwidth of
    every collective (``raw_tcp`` is none), and ours against gloo and MPI."""
    nbytes = mib * (1 << 20)
    med = {impl: statistics.median(ts) for impl, ts in samples.items()}
    busbw = {
        impl: 2 * (world - 1) / world * nbytes / t / 1e9
        for impl, t in med.items()
        if impl != "raw_tcp"
    }
    row: dict = {
        "bench": bench,
        **where,
        "size_mib": mib,
        "dtype": "float32",
        "timed_calls": args.blocks * args.iters,
        "median_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        "busbw_GBps": {k: round(v, 3) for k, v in busbw.items()},
    }
    if "gloo" in busbw:
        for impl in ("ours", "ours_tcp"):
            if impl in busbw:
                row[f"ratio_{impl}_gloo"] = round(busbw[impl] / busbw["gloo"], 3)
    if "mpi" in busbw and "ours" in busbw:
        row["ratio_ours_mpi"] = round(busbw["ours"] / busbw["mpi"], 3)
    if "ours" in groups:
        row["ours_transport"] = groups["ours"].transport
    return row


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
