"""Test harness for parameter-server processes: plays the driver's part (starts shards
with the documented command line, SIGKILLs and restarts them, reaps everything) and
runs worker scripts. Real processes, real gRPC on loopback, nothing mocked."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from elastic.ps.client import PSClient
from elastic.ps.settings import ClientSettings
from elastic.ps.client.link import ShardLink
from rendezvous import env
from rendezvous.keys import JobKeys
from tests.jobs import wait_until
from rendezvous.plan import Member, Plan

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "ps_worker.py")
READY = "ELASTIC_PS_READY "
CHECKPOINT = "ELASTIC_PS_CHECKPOINT "


wait_for = wait_until  # one polling helper for every test


class _Proc:
    """A child process whose stdout is read line by line in a thread."""

    def __init__(self, name: str, argv: list[str], environ: dict, log_dir: Path):
        self.name = name
        self.stderr_path = log_dir / f"{name}-{uuid.uuid4().hex[:6]}.err"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(argv, env=environ, stdout=subprocess.PIPE,
                                     stderr=self._stderr, cwd=str(ROOT), start_new_session=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            with self._cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_line(self, prefix: str, timeout: float, after: int = 0) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines[after:]:
                    if line.startswith(prefix):
                        return line
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"{self.name} exited {self.proc.returncode} before "
                                         f"printing {prefix!r}:\n{self.stderr()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name} did not print {prefix!r} in {timeout}s:\n"
                                         f"{self.stderr()}")
                self._cond.wait(min(left, 0.1))

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-6000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.reap(5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def reap(self, timeout: float) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        self._stderr.close()
        return rc


class PSJob:
    """Shards (and workers) of one job against one embedded store. Use as a context
    manager: every process is killed and reaped on exit, even when the test failed."""

    def __init__(self, store_server, tmp_path: Path, num_shards: int, mode: str = "async",
                 checkpoint_dir: str | None = None, checkpoint_interval: float = 0.3,
                 split_threshold: int = 64, job_id: str | None = None):
        self.store_server = store_server
        self.secret = store_server.secret
        self.store_url = f"embedded://{store_server.address}"
        self.job_id = job_id or f"ps-{uuid.uuid4().hex[:8]}"
        self.tmp = tmp_path
        self.logs = tmp_path / "logs"
        self.logs.mkdir(exist_ok=True)
        self.num_shards, self.mode = num_shards, mode
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_interval = checkpoint_interval
        self.split_threshold = split_threshold
        self.shards: dict[int, _Proc] = {}
        self.addresses: dict[int, str] = {}
        self.workers: list[_Proc] = []
        self._clients: list[PSClient] = []

    def env(self, **extra) -> dict:
        e = dict(os.environ)
        e.update({env.ENV_SECRET: self.secret, env.ENV_RENDEZVOUS: self.store_url,
                  env.ENV_JOB_ID: self.job_id, "PYTHONPATH": str(ROOT),
                  "PYTHONUNBUFFERED": "1"})
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def shard_argv(self, index: int) -> list[str]:
        """The command line the driver uses (and reuses unchanged for a restart)."""
        argv = [sys.executable, "-m", "elastic.ps.server", "--index", str(index),
                "--num-shards", str(self.num_shards), "--mode", self.mode,
                "--bind", "127.0.0.1:0", "--split-threshold", str(self.split_threshold)]
        if self.checkpoint_dir:
            argv += ["--checkpoint-dir", self.checkpoint_dir,
                     "--checkpoint-interval", str(self.checkpoint_interval)]
        return argv

    def start(self, indices=None, timeout: float = 60.0) -> "PSJob":
        indices = range(self.num_shards) if indices is None else indices
        for i in indices:  # all first, then wait: sync shards restore together
            self.shards[i] = _Proc(f"shard{i}", self.shard_argv(i), self.env(), self.logs)
        for i in indices:
            line = self.shards[i].wait_line(READY, timeout)
            self.addresses[i] = json.loads(line[len(READY):])["address"]
        return self

    def kill_shard(self, index: int) -> None:
        self.shards[index].kill()

    def restart_shard(self, index: int, timeout: float = 60.0) -> None:
        self.start([index], timeout)

    def checkpoints(self) -> list[dict]:
        shard0 = self.shards.get(0)
        return [json.loads(l[len(CHECKPOINT):]) for l in list(shard0.lines)
                if l.startswith(CHECKPOINT)] if shard0 else []

    def wait_checkpoint(self, min_step: int, timeout: float = 30.0) -> dict:
        return wait_for(lambda: next((c for c in self.checkpoints() if c["step"] >= min_step), None),
                        timeout, f"a checkpoint at step >= {min_step}")

    def client(self, **settings) -> PSClient:
        from elastic.ps.registry import StoreRegistry
        from rendezvous import open_store
        registry = StoreRegistry(open_store(self.store_url, self.secret), self.job_id)
        c = PSClient([self.addresses[i] for i in range(self.num_shards)], self.secret,
                     ClientSettings(**{"retry_deadline": 60.0, **settings}),
                     resolver=registry.lookup, on_close=[registry.close])
        self._clients.append(c)
        return c

    def shard_status(self, index: int) -> dict:
        """Describe of one shard, straight from it."""
        link = ShardLink(index, self.addresses[index], self.secret)
        try:
            header, _ = link.request("Describe", {}, timeout=10)
            return header
        finally:
            link.close()

    def publish_round(self, round_id: int, worker_ids: list[str]) -> None:
        """What the driver does when membership changes: a new plan in the store."""
        from rendezvous import open_store
        members = tuple(Member(w, "localhost", k, "127.0.0.1:1", k, k, len(worker_ids), 0, 1)
                        for k, w in enumerate(worker_ids))
        store = open_store(self.store_url, self.secret)
        try:
            store.put(JobKeys(self.job_id).round, Plan(round_id, members).to_json())
        finally:
            store.close()

    def worker(self, *args, **environ) -> _Proc:
        p = _Proc(f"worker{len(self.workers)}", [sys.executable, WORKER, *map(str, args)],
                  self.env(**environ), self.logs)
        self.workers.append(p)
        return p

    def wait_workers(self, timeout: float, workers=None) -> None:
        deadline = time.monotonic() + timeout
        for w in (self.workers if workers is None else workers):
            try:
                rc = w.reap(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{w.name} still running after {timeout}s:\n{w.stderr()}")
            assert rc == 0, f"{w.name} exited {rc}:\n{w.stderr()}"

    def shard_log(self, index: int) -> str:
        return "".join(p.read_text(errors="replace")
                       for p in sorted(self.logs.glob(f"shard{index}-*.err")))

    def close(self) -> None:
        for c in self._clients:
            c.close()
        for p in [*self.workers, *self.shards.values()]:
            p.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
