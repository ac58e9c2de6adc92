"""Shards under the driver's own supervisor: ``driver.ps.supervisor.PSSupervisor`` starts
them (and, with replicas, their backups) with the driver's command lines through the
local launcher, restarts them or fails them over as ``elastic-run`` does, and reports
its events here; ``PSJob`` (``harness.py``) runs the workers against them. Real
processes, the real store, the real failover; nothing mocked."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from driver.events import Event
from driver.launch.local import LocalLauncher
from driver.ps.supervisor import PSSupervisor, ShardLaunch, SupervisionSettings
from ps.client.link import ShardLink
from rendezvous import open_store
from rendezvous.schema.ps import ShardInfo
from tests.support.ps.harness import PSJob


class Events:
    """The supervisor's events, in order, with a wait for one."""

    def __init__(self):
        self._cond = threading.Condition()
        self.all: list[Event] = []

    def emit(self, event: Event) -> Event:
        with self._cond:
            self.all.append(event)
            self._cond.notify_all()
        return event

    def of(self, kind: str, shard: int | None = None) -> list:
        with self._cond:
            return [
                e
                for e in self.all
                if e.kind == kind and (shard is None or getattr(e, "shard", None) == shard)
            ]

    def wait(self, kind: str, shard: int, count: int = 1, timeout: float = 30.0):
        """The ``count``-th event of ``kind`` about ``shard``, once there."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(found := self.of(kind, shard)) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"no {kind} #{count} of shard {shard} within {timeout}s: "
                        f"{[str(e) for e in self.all]}"
                    )
                self._cond.wait(left)
            return found[count - 1]


class SupervisedJob:
    """``num_shards`` shards in ``mode`` under a ``PSSupervisor`` (``replicas`` 1: each
    with a backup); ``job`` is the ``PSJob`` whose workers train against them. A
    context manager: everything is stopped and reaped on exit."""

    def __init__(
        self,
        store_server,
        tmp_path: Path,
        num_shards: int,
        mode: str,
        replicas: int = 1,
        checkpoint_dir: str | None = None,
        checkpoint_interval: float = 0.3,
    ):
        self.job = PSJob(
            store_server,
            tmp_path,
            num_shards,
            mode,
            checkpoint_dir=checkpoint_dir,
            checkpoint_interval=checkpoint_interval,
        )
        self.events = Events()
        self.fatal: list[str] = []
        self._output = open(tmp_path / "logs" / "shards.out", "wb")  # noqa: SIM115
        self._store = open_store(self.job.store_url, self.job.secret)  # the supervisor's own
        replicated = ("--replicas", str(replicas)) if replicas else ()
        commands = [(*self.job.shard_argv(i), *replicated) for i in range(num_shards)]
        launch = ShardLaunch(
            LocalLauncher(self._output, self._output), tuple(commands), self.job.env()
        )
        self.supervisor = PSSupervisor(
            launch,
            SupervisionSettings(ready_timeout=60.0, store_patience=30.0, replicas=replicas),
            store=self._store,
            keys=self.job.keys,
            events=self.events,
            on_fatal=self.fatal.append,
        )

    def __enter__(self) -> SupervisedJob:
        try:
            self.supervisor.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            for worker in self.job.workers:
                worker.stop()
            self.supervisor.stop(coordinator_grace=10.0)
        finally:
            self.job.close()
            self._store.close()
            self._output.close()

    def primary_pid(self, index: int) -> int:
        pid = self.supervisor.primary_pid(index)
        assert pid is not None, f"shard {index} has no primary"
        return pid

    def backup_pid(self, index: int) -> int:
        pid = self.supervisor.backup_pid(index)
        assert pid is not None, f"shard {index} has no backup"
        return pid

    def record(self, index: int) -> ShardInfo:
        """Shard ``index``'s record in the store now (the process that serves it)."""
        kv = self._store.get(self.job.keys.ps_shard(index))
        assert kv is not None, f"shard {index} has no record"
        return ShardInfo.from_json(kv.value)

    def describe(self, index: int) -> dict:
        """Describe of the process that serves shard ``index`` now."""
        info = self.record(index)
        link = ShardLink(index, info.address, self.job.secret, incarnation=info.incarnation)
        try:
            header, _ = link.request("Describe", timeout=10)
            return header
        finally:
            link.close()

    def output(self) -> str:
        self._output.flush()
        return (self.job.logs / "shards.out").read_text(errors="replace")
