"""Test harness for parameter-server processes: plays the driver's part (starts shards
with the documented command line, waits for their records in the store, SIGKILLs and
restarts them, reaps everything) and runs worker scripts. Real processes, real gRPC on
loopback, nothing mocked."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from driver.ps.command import shard_command
from ps.client import PSClient
from ps.client.link import ShardLink
from ps.registry import StoreRegistry
from ps.settings import ClientSettings
from rendezvous import env, open_store
from rendezvous.keys import JobKeys
from rendezvous.schema.ps import CheckpointRecord, ShardInfo
from rendezvous.schema.rounds import Member, Plan
from rendezvous.store import PUT
from tests.support.jobs import wait_until
from tests.support.paths import ROOT

WORKER = str(ROOT / "tests" / "support" / "ps" / "worker.py")


wait_for = wait_until  # one polling helper for every test


class _Announcements:
    """What the shards of one job say in the store (``ShardInfo`` per index, every
    ``CheckpointRecord`` with its store revision), followed by a watch."""

    def __init__(self, store, keys: JobKeys):
        self._keys = keys
        self._cond = threading.Condition()
        self.shards: dict[int, ShardInfo] = {}
        self.checkpoints: list[tuple[int, CheckpointRecord]] = []
        kvs, self._watch = store.read_and_watch(keys.prefix)
        for kv in kvs:
            self._note(kv.key, kv.value, kv.mod_revision)
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        for event in self._watch:  # ends when the watch is cancelled
            if event.type == PUT:
                self._note(event.key, event.value, event.revision)

    def _note(self, key: str, value: bytes, revision: int) -> None:
        with self._cond:
            if key.startswith(self._keys.ps):
                info = ShardInfo.from_json(value)
                self.shards[info.index] = info
            elif key == self._keys.ps_checkpoint:
                self.checkpoints.append((revision, CheckpointRecord.from_json(value)))
            self._cond.notify_all()

    def checkpoints_after(self, revision: int) -> list[CheckpointRecord]:
        with self._cond:
            return [record for rev, record in self.checkpoints if rev > revision]

    def wait(
        self,
        predicate: Callable[[], object],
        timeout: float,
        what: str,
        gone: Callable[[], str | None] = lambda: None,
    ):
        """``predicate()`` (called under the lock) once true; AssertionError after
        ``timeout`` or as soon as ``gone()`` names a reason to stop waiting."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate()
                if value:
                    return value
                reason = gone()
                if reason:
                    raise AssertionError(f"{reason} before {what}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {what} within {timeout}s")
                self._cond.wait(min(left, 0.1))  # also wakes to look at the process

    def close(self) -> None:
        self._watch.cancel()
        self._thread.join(timeout=5)


class _Proc:
    """A child process in its own session; its stdout and stderr go to one log file."""

    def __init__(self, name: str, argv: list[str], environ: dict, log_dir: Path):
        self.name = name
        self.stderr_path = log_dir / f"{name}-{uuid.uuid4().hex[:6]}.err"
        with open(self.stderr_path, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                argv, env=environ, stdout=log, stderr=log, cwd=str(ROOT), start_new_session=True
            )

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-6000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.reap(5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        self.kill()

    def reap(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)


class PSJob:
    """Shards (and workers) of one job against one embedded store. Use as a context
    manager: every process is killed and reaped on exit, even when the test failed."""

    def __init__(
        self,
        store_server,
        tmp_path: Path,
        num_shards: int,
        mode: str = "async",
        checkpoint_dir: str | None = None,
        checkpoint_interval: float = 0.3,
        split_threshold: int = 64,
        job_id: str | None = None,
        wrapper: tuple[str, ...] = (),
    ):
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
        self.wrapper = wrapper  # put before a shard's command line (it must exec it)
        self.shards: dict[int, _Proc] = {}
        self.records: dict[int, ShardInfo] = {}  # each shard's, once ready
        self.addresses: dict[int, str] = {}
        self.workers: list[_Proc] = []
        self._clients: list[PSClient] = []
        self.keys = JobKeys(self.job_id)
        self._store = open_store(self.store_url, self.secret)
        self._announced = _Announcements(self._store, self.keys)
        self._checkpoint_floor = 0  # store revision when the current shard 0 started

    def env(self, **extra) -> dict:
        e = dict(os.environ)
        e.update(
            {
                env.ENV_SECRET: self.secret,
                env.ENV_RENDEZVOUS: self.store_url,
                env.ENV_JOB_ID: self.job_id,
                "PYTHONPATH": str(ROOT),
                "PYTHONUNBUFFERED": "1",
            }
        )
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def shard_argv(self, index: int) -> list[str]:
        """The command line the driver uses (and reuses unchanged for a restart)."""
        command = shard_command(
            index,
            self.num_shards,
            self.mode,
            "127.0.0.1",
            self.checkpoint_dir,
            self.checkpoint_interval,
            verbose=True,  # the tests read what a shard says it did
        )
        return [*command, "--split-threshold", str(self.split_threshold)]

    def start(self, indices=None, timeout: float = 60.0, extra: tuple[str, ...] = ()) -> PSJob:
        """Start shards ``indices`` (all by default), their command line followed by
        ``extra``, and wait until each says it is ready."""
        indices = range(self.num_shards) if indices is None else indices
        try:
            for i in indices:  # all first, then wait: sync shards restore together
                if i == 0:
                    _, self._checkpoint_floor = self._store.get_prefix(self.keys.ps_checkpoint)
                argv = [*self.wrapper, *self.shard_argv(i), *extra]
                self.shards[i] = _Proc(f"shard{i}", argv, self.env(), self.logs)
            for i in indices:
                self.records[i] = self._wait_ready(i, timeout)
                self.addresses[i] = self.records[i].address
        except BaseException:
            self.close()  # ``with PSJob(...).start()`` never entered: reap here
            raise
        return self

    def _wait_ready(self, index: int, timeout: float) -> ShardInfo:
        """The record of shard ``index``'s current process once it says it is ready."""
        proc = self.shards[index]

        def ready() -> ShardInfo | None:
            info = self._announced.shards.get(index)
            return info if info is not None and info.ready and info.pid == proc.proc.pid else None

        def gone() -> str | None:
            if proc.proc.poll() is None:
                return None
            return f"{proc.name} exited {proc.proc.returncode}:\n{proc.stderr()}"

        return self._announced.wait(ready, timeout, f"ready record of {proc.name}", gone)

    def kill_shard(self, index: int) -> None:
        self.shards[index].kill()

    def restart_shard(self, index: int, timeout: float = 60.0, in_place: bool = False) -> None:
        """Start shard ``index`` again; ``in_place``: on the address it had (its last
        ``--bind`` wins), so what still holds that address reaches the new process."""
        self.start([index], timeout, ("--bind", self.addresses[index]) if in_place else ())

    def checkpoints(self) -> list[dict]:
        """The checkpoints the current shard 0 announced in the store, oldest first."""
        return [
            dataclasses.asdict(record)
            for record in self._announced.checkpoints_after(self._checkpoint_floor)
        ]

    def wait_checkpoint(self, min_step: int, timeout: float = 30.0) -> dict:
        def found() -> dict | None:
            return next((c for c in self.checkpoints() if c["step"] >= min_step), None)

        return self._announced.wait(found, timeout, f"a checkpoint at step >= {min_step}")

    def client(self, **settings) -> PSClient:
        registry = StoreRegistry(open_store(self.store_url, self.secret), self.job_id)
        c = PSClient(
            [self.records[i] for i in range(self.num_shards)],
            self.secret,
            ClientSettings(**{"retry_deadline": 60.0, **settings}),
            resolver=registry.lookup,
            on_close=[registry.close],
        )
        self._clients.append(c)
        return c

    def shard_status(self, index: int) -> dict:
        """Describe of one shard, straight from it."""
        record = self.records[index]
        link = ShardLink(index, record.address, self.secret, incarnation=record.incarnation)
        try:
            header, _ = link.request("Describe", timeout=10)
            return header
        finally:
            link.close()

    def publish_round(self, round_id: int, worker_ids: list[str]) -> None:
        """What the driver does when membership changes: a new plan in the store."""
        members = tuple(
            Member(w, "localhost", k, "127.0.0.1:1", k, k, len(worker_ids), 0, 1)
            for k, w in enumerate(worker_ids)
        )
        self._store.put(self.keys.round, Plan(round_id, members).to_json())

    def worker(self, *args, **environ) -> _Proc:
        p = _Proc(
            f"worker{len(self.workers)}",
            [sys.executable, WORKER, *map(str, args)],
            self.env(**environ),
            self.logs,
        )
        self.workers.append(p)
        return p

    def wait_workers(self, timeout: float, workers=None) -> None:
        deadline = time.monotonic() + timeout
        for w in self.workers if workers is None else workers:
            try:
                rc = w.reap(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"{w.name} still running after {timeout}s:\n{w.stderr()}"
                ) from None
            assert rc == 0, f"{w.name} exited {rc}:\n{w.stderr()}"

    def shard_log(self, index: int) -> str:
        return "".join(
            p.read_text(errors="replace") for p in sorted(self.logs.glob(f"shard{index}-*.err"))
        )

    def close(self) -> None:
        for c in self._clients:
            c.close()
        for p in [*self.workers, *self.shards.values()]:
            p.stop()
        self._announced.close()
        self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
