"""Parameter-server shards under the driver (``--num-ps N``): start, watch, restart.

Each shard is ``python -m elastic.ps.server --index I ...`` on the driver's machine (the
driver starts a command; it never imports ``elastic``). A shard announces itself on stdout
(``ELASTIC_PS_READY {...}``, and shard 0 ``ELASTIC_PS_CHECKPOINT {...}`` per checkpoint)
and publishes its address in the store, where clients find it. A shard that dies is
restarted with the same arguments: it loads the newest complete checkpoint, and clients
retry until it is back. A shard dying over and over (``MAX_RESTARTS`` within
``RESTART_WINDOW``) ends the job: restarting cannot fix whatever kills it.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections import deque

from driver import events as ev
from driver.launcher import (LaunchSpec, LauncherError, LocalLauncher, WorkerProcess,
                             stop_all)

log = logging.getLogger(__name__)

READY_PREFIX = b"ELASTIC_PS_READY "
CHECKPOINT_PREFIX = b"ELASTIC_PS_CHECKPOINT "
MAX_RESTARTS = 10
RESTART_WINDOW = 60.0
STOP_GRACE = 5.0


def shard_command(index: int, num_shards: int, mode: str, bind_host: str,
                  checkpoint_dir: str | None, checkpoint_interval: float) -> tuple[str, ...]:
    """The command line of shard ``index`` (pure)."""
    command = [sys.executable, "-m", "elastic.ps.server", "--index", str(index),
               "--num-shards", str(num_shards), "--mode", mode, "--bind", f"{bind_host}:0"]
    if checkpoint_dir:
        command += ["--checkpoint-dir", checkpoint_dir,
                    "--checkpoint-interval", str(checkpoint_interval)]
    return tuple(command)


class PSSupervisor:
    def __init__(self, job, ready_timeout: float | None = None):
        cfg = job.config
        self.job = job
        self.events = job.events
        self.num_shards = cfg.num_ps
        self.ready_timeout = ready_timeout or cfg.start_timeout
        bind = "127.0.0.1" if job.all_local else job.advertised_host
        checkpoint_dir = os.path.abspath(cfg.ps_checkpoint_dir) if cfg.ps_checkpoint_dir else None
        self.commands = [shard_command(i, cfg.num_ps, cfg.ps_mode, bind, checkpoint_dir,
                                       cfg.ps_checkpoint_interval) for i in range(cfg.num_ps)]
        self.env = job.shard_env()
        self._launcher = LocalLauncher()
        self._lock = threading.Condition()
        self._procs: dict[int, WorkerProcess] = {}
        self._ready: dict[int, dict] = {}
        self._restarts: dict[int, deque] = {i: deque() for i in range(cfg.num_ps)}
        self._stopping = threading.Event()

    # ---- lifecycle ----
    def start(self) -> None:
        """Start every shard and wait until each announced its address.

        Raises the job's JobFailed when a shard is not ready within the deadline."""
        for index in range(self.num_shards):
            self._launch(index)
        deadline = time.monotonic() + self.ready_timeout
        with self._lock:
            while len(self._ready) < self.num_shards:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(self.num_shards)) - set(self._ready))
                    from driver.job import JobFailed
                    raise JobFailed(f"ps shards {missing} not ready within {self.ready_timeout:g}s "
                                    "(see their output above)")
                self._lock.wait(min(remaining, 0.5))

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
            procs = list(self._procs.values())
        stop_all(procs, STOP_GRACE)

    # ---- one shard ----
    def _launch(self, index: int) -> bool:
        """Start shard ``index`` (False when stopping). Raises LauncherError."""
        spec = LaunchSpec(host="localhost", slot=index, command=self.commands[index],
                          env=self.env, cwd=os.getcwd(), label=f"ps{index}")
        # Under the lock with the stopping check, so a restart racing ``stop`` cannot leave
        # a shard behind: either stop sees it, or it is never started.
        with self._lock:
            if self._stopping.is_set():
                return False
            proc = self._launcher.launch(spec, prefix=lambda: f"[ps{index}]",
                                         on_stdout_line=lambda line: self._announce(index, line))
            self._procs[index] = proc
            self._ready.pop(index, None)
        thread = threading.Thread(target=self._watch, args=(index, proc), daemon=True,
                                  name=f"ps{index}-wait")
        thread.start()
        return True

    def _announce(self, index: int, line: bytes) -> bool:
        """Turn a shard's machine-readable stdout lines into events (True: consumed)."""
        if line.startswith(READY_PREFIX):
            info = json.loads(line[len(READY_PREFIX):])
            with self._lock:
                self._ready[index] = info
                self._lock.notify_all()
            self.events.emit(ev.PS_STARTED, shard=index, address=info.get("address"),
                             pid=info.get("pid"))
            return True
        if line.startswith(CHECKPOINT_PREFIX):
            info = json.loads(line[len(CHECKPOINT_PREFIX):])
            self.events.emit(ev.CHECKPOINT_WRITTEN, step=info.get("step"), path=info.get("dir"),
                             seconds=round((info.get("pause_ms", 0) + info.get("write_ms", 0)) / 1e3, 3),
                             checkpoint=info.get("checkpoint_id"))
            return True
        return False

    def _watch(self, index: int, proc: WorkerProcess) -> None:
        code = proc.wait(timeout=None)
        if self._stopping.is_set():
            return
        self.events.emit(ev.PS_EXITED, shard=index, code=code)
        now = time.monotonic()
        history = self._restarts[index]
        history.append(now)
        while history and history[0] < now - RESTART_WINDOW:
            history.popleft()
        if len(history) > MAX_RESTARTS:
            self.job.post("fatal", f"ps shard {index} died {len(history)} times within "
                                   f"{RESTART_WINDOW:g}s (last exit: {code}); giving up")
            return
        try:
            if self._launch(index):
                self.events.emit(ev.PS_RESTARTED, shard=index)
        except LauncherError as exc:
            self.job.post("fatal", f"cannot restart ps shard {index}: {exc}")
