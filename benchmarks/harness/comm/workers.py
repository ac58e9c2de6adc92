"""Real communicator worker processes (see ``benchmarks/harness/comm/worker.py``), for the
communicator tests (``tests/support/comm/harness.py``, their fixture) and the failure
detection benchmark.

``Workers`` spawns them, here or on a test host (``benchmarks/harness/netns.py``: the
worker then listens on the host's address), forms rounds, and always reaps every
process it started (kill and wait), even when a test fails half-way. Every wait has a
deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from benchmarks.harness.netns import NetnsHost
from benchmarks.harness.paths import ROOT
from rendezvous.net.auth import make_secret


class Worker:
    """One worker process, here or on ``host``. ``pid`` is the worker's own id as seen
    from here (on a host, ``proc`` is the ``nsenter`` that started it): signals and
    kills go to it."""

    def __init__(self, secret: str, host: NetnsHost | None = None):
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        argv = [sys.executable, "-m", "benchmarks.harness.comm.worker", "--secret", secret]
        pipe = subprocess.PIPE
        if host is None:
            self.proc = subprocess.Popen(
                argv, cwd=str(ROOT), env=env, stdin=pipe, stdout=pipe, stderr=pipe
            )
            self.pid = self.proc.pid
        else:
            self.proc = host.popen(
                [*argv, "--bind", host.address], env=env, stdin=pipe, stdout=pipe, stderr=pipe
            )
            self.pid = host.process_of(self.proc)
        self.host = host
        # All three are pipes (above).
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self._stdin, self._stdout, self._stderr = (
            self.proc.stdin,
            self.proc.stdout,
            self.proc.stderr,
        )
        self._events: queue.Queue[dict | None] = queue.Queue()
        self.backlog: list[dict] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.address: str | None = None

    def _read_stdout(self) -> None:
        for line in self._stdout:
            try:
                self._events.put(json.loads(line))
            except ValueError:
                self.stderr.append(line.decode(errors="replace"))
        self._events.put(None)

    def _read_stderr(self) -> None:
        for line in self._stderr:
            self.stderr.append(line.decode(errors="replace"))

    def send(self, cmd: str, **fields) -> None:
        self._stdin.write((json.dumps({"cmd": cmd, **fields}) + "\n").encode())
        self._stdin.flush()

    def expect(self, event: str, timeout: float = 30.0) -> dict:
        """The next event named ``event`` (others are kept in ``backlog``).

        Raises AssertionError on an "error" event, on exit, or at the deadline."""
        for i, kept in enumerate(self.backlog):
            if kept["event"] == event:
                return self.backlog.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"worker {self.pid}: no {event!r} within {timeout} s; "
                    f"backlog={self.backlog}; stderr={self.tail()}"
                )
            try:
                ev = self._events.get(timeout=remaining)
            except queue.Empty:
                continue
            if ev is None:
                self._events.put(None)
                raise AssertionError(
                    f"worker {self.pid} exited (rc={self.proc.poll()}) while "
                    f"waiting for {event!r}; stderr={self.tail()}"
                )
            if ev["event"] == event:
                return ev
            if ev["event"] == "error" and event != "error":
                raise AssertionError(
                    f"worker {self.pid}: {ev.get('type')}: {ev.get('msg')}\n{ev.get('tb', '')}"
                )
            self.backlog.append(ev)

    def events_named(self, event: str) -> list[dict]:
        """Events already received (without waiting) called ``event``."""
        while True:
            try:
                ev = self._events.get_nowait()
            except queue.Empty:
                break
            if ev is None:
                self._events.put(None)
                break
            self.backlog.append(ev)
        return [ev for ev in self.backlog if ev["event"] == event]

    def tail(self, n: int = 30) -> str:
        return "".join(self.stderr[-n:])

    def signal(self, sig: int) -> float:
        """Send ``sig``; returns the wall-clock time just before (for latencies)."""
        t = time.time()
        os.kill(self.pid, sig)
        return t

    def ask_exit(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGCONT)  # a stopped worker cannot exit
                self.send("exit")
                self._stdin.close()
            except (OSError, ValueError):
                pass

    def reap(self, timeout: float = 5.0) -> None:
        """Ask to exit, then kill if needed; always waits for the process."""
        self.ask_exit()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)  # the worker itself, not its nsenter
            self.proc.wait(10)
        for f in (self._stdout, self._stderr, self._stdin):
            with contextlib.suppress(OSError, ValueError):
                f.close()


class Workers:
    """A pool of worker processes sharing one job secret."""

    def __init__(self):
        self.secret = make_secret()
        self.all: list[Worker] = []

    def spawn(self, n: int, host: NetnsHost | None = None) -> list[Worker]:
        """``n`` new workers, here or on ``host``, once each is listening."""
        new = [Worker(self.secret, host) for _ in range(n)]
        self.all += new
        for w in new:
            w.address = w.expect("listening", timeout=60)["address"]
        return new

    def form(
        self,
        members: list[Worker],
        round_id: int = 1,
        timeout: float = 60.0,
        overrides: dict[int, dict] | None = None,
        **settings,
    ) -> list[dict]:
        """Build a communicator for ``members`` (in rank order) on every one of them,
        with ``settings`` and, for rank r, ``overrides[r]`` over them."""
        addresses = [w.address for w in members]
        for rank, w in enumerate(members):
            mine = {**settings, **(overrides or {}).get(rank, {})}
            w.send("form", round=round_id, rank=rank, addresses=addresses, settings=mine)
        return [w.expect("formed", timeout) for w in members]

    def reap(self, timeout: float = 5.0) -> None:
        """Every worker exits or is killed, and is waited for (one shared deadline)."""
        for w in self.all:
            w.ask_exit()
        deadline = time.monotonic() + timeout
        for w in self.all:
            w.reap(max(0.0, deadline - time.monotonic()))
