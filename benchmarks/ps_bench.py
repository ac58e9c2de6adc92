"""Parameter-server benchmark: push+pull throughput against a raw socket transfer of
the same bytes, the cost of a replica (``--ps-replicas 1``) on it, and the step-time cost
of checkpointing.

    python -m benchmarks.ps_bench                    # full run (a few minutes)
    python -m benchmarks.ps_bench --sizes 16 --shards 2 --reps 5 --skip-checkpoint

Prints one JSON line per measured configuration:

* ``ps_throughput``: a step is ``push(grads)`` + ``pull()`` of the whole model (SGD on
  the shards), so ``2 * model bytes`` move per step. The baseline moves the same bytes
  over plain TCP with the same fan-out: one receiver process per shard, each sent its
  share and sending it back. PS and raw repetitions alternate so both see the same
  machine load; figures are medians, and ``ratio`` = ps MB/s / raw MB/s.
* ``ps_replica_throughput``: the same step against shards without a backup and against
  shards with one (every update mirrored to the backup, and acknowledged once the backup
  holds it), in one run: two jobs side by side, their steps alternating. One line per
  configuration (``replicas`` 0 and 1); ``relative`` = MB/s / the MB/s without replicas.
* ``ps_checkpoint_overhead``: a job checkpointing every ``--ckpt-intervals`` seconds
  trains for ``--ckpt-seconds``; ``overhead`` = mean step time of all steps / mean step
  time of the steps that overlapped no checkpoint - 1 (see ``checkpoint_overhead`` for
  why not a second job). Means, not medians: a checkpoint's cost lands on a few steps.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import numpy as np

from benchmarks.harness.paths import ROOT
from ps.client import PSClient
from rendezvous import env, open_store
from rendezvous.backends.embedded import EmbeddedServer
from rendezvous.keys import JobKeys
from rendezvous.net import auth
from rendezvous.schema.ps import CheckpointRecord, ReplicaRecord, ShardInfo

MiB = 1 << 20


# ---------------------------------------------------------------- the model
def model(total_mib: int) -> dict:
    """Four equal float32 matrices (split across shards) and a few small biases."""
    rows = total_mib * MiB // 4 // 4 // 1024
    params: dict[str, np.ndarray] = {
        f"layer{k}/kernel": np.full((rows, 1024), 0.5, np.float32) for k in range(4)
    }
    params.update({f"layer{k}/bias": np.zeros(1024, np.float32) for k in range(4)})
    return params


def nbytes(tensors: dict) -> int:
    return sum(a.nbytes for a in tensors.values())


# ---------------------------------------------------------------- raw socket baseline
def raw_server(port_file: str) -> None:
    """Echo server: per request, an 8-byte length then that many bytes, sent back."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(listener.getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    while True:
        head = _recv_exact(conn, bytearray(8))
        if head is None:
            return
        (n,) = struct.unpack("!Q", head)
        if len(buf) < n:
            buf = bytearray(n)
        view = memoryview(buf)[:n]
        if _recv_exact(conn, view) is None:
            return
        conn.sendall(view)


def _recv_exact(conn, buf):
    view, got = memoryview(buf), 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return buf


class RawPeers:
    """One raw echo process per shard, and a round trip of each shard's share."""

    def __init__(self, count: int, tmp: str):
        self.procs, self.socks = [], []
        for _ in range(count):
            port_file = os.path.join(tmp, f"raw-{uuid.uuid4().hex}.port")
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.ps_bench", "--raw-server", port_file],
                    cwd=ROOT,
                )
            )
            deadline = time.monotonic() + 30
            while not os.path.exists(port_file):
                if time.monotonic() > deadline or self.procs[-1].poll() is not None:
                    raise RuntimeError("raw echo server did not start")
                time.sleep(0.01)
            with open(port_file) as f:
                port = int(f.read())
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.socks.append(s)

    def round_trip(self, shares: list[memoryview]) -> float:
        def one(s, data, out):
            s.sendall(struct.pack("!Q", len(data)))
            s.sendall(data)
            _recv_exact(s, out)

        outs = [bytearray(len(d)) for d in shares]
        threads = [
            threading.Thread(target=one, args=(s, d, o))
            for s, d, o in zip(self.socks, shares, outs)
        ]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return time.perf_counter() - t

    def close(self):
        for s in self.socks:
            s.close()
        for p in self.procs:
            p.kill()
            p.wait(timeout=10)


# ---------------------------------------------------------------- shards
def _ready(pid: int):
    """Whether a shard's record says process ``pid`` is ready."""

    def check(kv) -> bool:
        if kv is None:
            return False
        info = ShardInfo.from_json(kv.value)
        return info.ready and info.pid == pid

    return check


def _in_step(kv) -> bool:
    """Whether a shard's replica record names a backup in step."""
    return kv is not None and ReplicaRecord.from_json(kv.value).backup != ""


class Shards:
    """Shard processes started as the driver starts them, announcing themselves and
    their checkpoints in an embedded store (as under elastic-run); with ``replicas`` a
    backup process for each, in step before the shards are used."""

    def __init__(
        self,
        count: int,
        secret: str,
        mode: str = "async",
        checkpoint_dir=None,
        interval: float = 30.0,
        job_id: str = "bench",
        replicas: int = 0,
    ):
        self.procs, self.addresses = [], []
        self._server = EmbeddedServer(secret)
        self._server.start()
        self._store = open_store(f"embedded://{self._server.address}", secret)
        keys = JobKeys(job_id)
        _, self._watch = self._store.read_and_watch(keys.ps_checkpoint)
        environ = {
            **os.environ,
            env.ENV_SECRET: secret,
            "PYTHONPATH": str(ROOT),
            env.ENV_RENDEZVOUS: f"embedded://{self._server.address}",
            env.ENV_JOB_ID: job_id,
        }
        for i in range(count):
            argv = [
                sys.executable,
                "-m",
                "ps.server",
                "--index",
                str(i),
                "--num-shards",
                str(count),
                "--mode",
                mode,
            ]
            if checkpoint_dir:
                argv += ["--checkpoint-dir", checkpoint_dir, "--checkpoint-interval", str(interval)]
            if replicas:
                argv += ["--replicas", str(replicas)]
            for backup in [False, True] if replicas else [False]:
                log_path = os.environ.get("PS_BENCH_SHARD_LOG")
                log_name = f"{log_path}.{job_id}.{i}{'b' * backup}" if log_path else os.devnull
                with open(log_name, "ab") as err:  # the shard keeps its own descriptor
                    self.procs.append(
                        subprocess.Popen(
                            [*argv, *(["--backup"] if backup else [])],
                            env=environ,
                            stdout=subprocess.DEVNULL,
                            stderr=err,
                            cwd=ROOT,
                        )
                    )
        self.announced: list[tuple[float, dict]] = []  # (when seen, CheckpointRecord fields)
        for i, p in enumerate(self.procs[:: 2 if replicas else 1]):
            kv = self._store.wait_for(keys.ps_shard(i), _ready(p.pid), timeout=120)
            if kv is None:
                raise RuntimeError(f"ps shard {i} was not ready within 120s")
            self.addresses.append(ShardInfo.from_json(kv.value).address)
            if replicas and self._store.wait_for(keys.ps_replica(i), _in_step, 120) is None:
                raise RuntimeError(f"ps shard {i} had no backup in step within 120s")
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self):
        for event in self._watch:  # ends when the watch is cancelled
            record = CheckpointRecord.from_json(event.value)
            self.announced.append(
                (
                    time.monotonic(),
                    {
                        "checkpoint_id": record.checkpoint_id,
                        "step": record.step,
                        "pause_ms": record.pause_ms,
                        "write_ms": record.write_ms,
                    },
                )
            )

    def wait_checkpoints(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.announced) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no checkpoint within {timeout}s")
            time.sleep(0.05)

    def close(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        self._watch.cancel()
        self._store.close()
        self._server.stop()


def ps_step(client, grads) -> float:
    t = time.perf_counter()
    client.push(grads)
    client.pull()
    return time.perf_counter() - t


# ---------------------------------------------------------------- measurements
def throughput(size_mib: int, shards: int, reps: int, tmp: str) -> dict:
    secret = auth.make_secret()
    params = model(size_mib)
    grads = {k: np.full_like(v, 1e-3) for k, v in params.items()}
    total = nbytes(params)
    flat = np.concatenate([g.reshape(-1).view(np.uint8) for g in grads.values()])
    shares = [memoryview(part.data) for part in np.array_split(flat, shards)]
    servers = Shards(shards, secret)
    raw = RawPeers(shards, tmp)
    client = PSClient(servers.addresses, secret)
    try:
        client.init(params, optimizer="sgd", lr=0.01)
        for _ in range(2):  # warm-up: connections, allocations
            ps_step(client, grads)
            raw.round_trip(shares)
        ps_times, raw_times = [], []
        for _ in range(reps):
            ps_times.append(ps_step(client, grads))
            raw_times.append(raw.round_trip(shares))
    finally:
        client.close()
        raw.close()
        servers.close()
    ps_s, raw_s = statistics.median(ps_times), statistics.median(raw_times)
    moved = 2 * total / 1e6
    return {
        "bench": "ps_throughput",
        "model_mib": size_mib,
        "shards": shards,
        "reps": reps,
        "transport": "grpc+bulk",
        "ps_step_s": round(ps_s, 4),
        "raw_round_trip_s": round(raw_s, 4),
        "ps_mb_s": round(moved / ps_s, 1),
        "raw_mb_s": round(moved / raw_s, 1),
        "ratio": round(raw_s / ps_s, 3),
    }


def replica_throughput(size_mib: int, shards: int, reps: int) -> list[dict]:
    """Push+pull steps of one model against shards without and with a backup each (two
    jobs side by side, their steps alternating); one line per configuration."""
    secret = auth.make_secret()
    params = model(size_mib)
    grads = {k: np.full_like(v, 1e-3) for k, v in params.items()}
    jobs = [
        Shards(shards, secret, job_id=f"bench-replicas-{replicas}", replicas=replicas)
        for replicas in (0, 1)
    ]
    clients = [PSClient(job.addresses, secret) for job in jobs]
    times: list[list[float]] = [[], []]
    try:
        for client in clients:
            client.init(params, optimizer="sgd", lr=0.01)
            for _ in range(2):  # warm-up: connections, allocations
                ps_step(client, grads)
        for _ in range(reps):
            for replicas, client in enumerate(clients):
                times[replicas].append(ps_step(client, grads))
    finally:
        for client in clients:
            client.close()
        for job in jobs:
            job.close()
    moved = 2 * nbytes(params) / 1e6
    medians = [statistics.median(t) for t in times]
    return [
        {
            "bench": "ps_replica_throughput",
            "model_mib": size_mib,
            "shards": shards,
            "replicas": replicas,
            "reps": reps,
            "step_s": round(medians[replicas], 4),
            "mb_s": round(moved / medians[replicas], 1),
            "relative": round(medians[0] / medians[replicas], 3),
        }
        for replicas in (0, 1)
    ]


def checkpoint_overhead(
    size_mib: int, shards: int, interval: float, seconds: float, tmp: str
) -> dict:
    """Train one checkpointing job for ``seconds``; compare the mean step time of the
    whole run with the mean over steps that overlapped no checkpoint (from its start,
    ``pause_ms + write_ms`` before shard 0 announced it, to the announcement, padded by
    ``_MARGIN``). Both sets share the same minutes of machine load, which a comparison
    with a second job would not on a shared machine (measured there: two identical jobs
    without checkpoints differed by -27%..+36% in alternating 2 s blocks)."""
    secret = auth.make_secret()
    params = model(size_mib)
    grads = {k: np.full_like(v, 1e-3) for k, v in params.items()}
    job = Shards(
        shards,
        secret,
        checkpoint_dir=os.path.join(tmp, f"ckpt-{uuid.uuid4().hex}"),
        interval=interval,
        job_id="bench-ckpt",
    )
    client = PSClient(job.addresses, secret)
    steps = []
    try:
        client.init(params, optimizer="sgd", lr=0.01)
        ps_step(client, grads)
        job.wait_checkpoints(1, timeout=interval + 60)  # the initial state's checkpoint
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.monotonic()
            ps_step(client, grads)
            steps.append((start, time.monotonic()))
        time.sleep(0.2)  # let an announcement in flight arrive before classifying steps
        announced = list(job.announced)[1:]
    finally:
        client.close()
        job.close()
    windows = [
        (t - (c["pause_ms"] + c["write_ms"]) / 1000 - _MARGIN, t + _MARGIN) for t, c in announced
    ]
    outside = [b - a for a, b in steps if not any(a < hi and b > lo for lo, hi in windows)]
    every = [b - a for a, b in steps]
    return {
        "bench": "ps_checkpoint_overhead",
        "model_mib": size_mib,
        "shards": shards,
        "interval_s": interval,
        "seconds": seconds,
        "steps": len(every),
        "checkpoints": len(windows),
        "steps_during_checkpoints": len(every) - len(outside),
        "step_s_mean": round(statistics.mean(every), 4),
        "step_s_mean_without_checkpoints": round(statistics.mean(outside), 4),
        "overhead": round(statistics.mean(every) / statistics.mean(outside) - 1, 4),
        "pause_ms_median": statistics.median(c["pause_ms"] for _, c in announced)
        if announced
        else None,
        "write_ms_median": statistics.median(c["write_ms"] for _, c in announced)
        if announced
        else None,
    }


_MARGIN = 0.05


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--raw-server", metavar="PORT_FILE", help=argparse.SUPPRESS)
    p.add_argument("--sizes", type=int, nargs="+", default=[16, 64], help="model sizes in MiB")
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--ckpt-size", type=int, default=64)
    p.add_argument("--ckpt-shards", type=int, default=2)
    p.add_argument("--ckpt-intervals", type=float, nargs="+", default=[10.0, 2.0])
    p.add_argument("--ckpt-seconds", type=float, default=60.0, help="training time per interval")
    p.add_argument("--replica-shards", type=int, nargs="+", default=[1, 2])
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-replicas", action="store_true")
    p.add_argument("--skip-checkpoint", action="store_true")
    args = p.parse_args(argv)
    if args.raw_server:
        raw_server(args.raw_server)
        return 0
    with tempfile.TemporaryDirectory(prefix="ps-bench-") as tmp:
        if not args.skip_throughput:
            for size in args.sizes:
                for shards in args.shards:
                    print(json.dumps(throughput(size, shards, args.reps, tmp)), flush=True)
        if not args.skip_replicas:
            for size in args.sizes:
                for shards in args.replica_shards:
                    for line in replica_throughput(size, shards, args.reps):
                        print(json.dumps(line), flush=True)
        if not args.skip_checkpoint:
            for interval in args.ckpt_intervals:
                print(
                    json.dumps(
                        checkpoint_overhead(
                            args.ckpt_size, args.ckpt_shards, interval, args.ckpt_seconds, tmp
                        )
                    ),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
