"""Run ``elastic-run`` as a real subprocess for integration tests, and read what it did.

``ElasticRun`` starts the driver in its own process group with stdout/stderr to files,
follows its stdout for ``progress N`` lines (printed by ``workloads/exact_sum.py``) and
reads the events file. ``stop()`` (also on ``__exit__``) ends the driver and SIGKILLs any
worker the events file names that is still alive, so nothing outlives a failed test.
With ``host`` (a ``benchmarks.harness.netns.NetnsHost``) the driver runs on that test
host; the pids its events name are then the hosts' own, and the hosts' teardown (not
``stop()``) reaps its workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO

from benchmarks.harness.paths import ROOT
from rendezvous import open_store
from rendezvous.keys import JobKeys
from rendezvous.schema.agents import AgentRecord
from rendezvous.schema.workers import ProgressRecord

#: the tests' training of exact sums, whose result each run checks
EXACT_SUM = ROOT / "tests" / "support" / "workloads" / "exact_sum.py"
_PROGRESS = re.compile(r"progress (\d+)")


def wait_until(
    predicate,
    timeout: float,
    what: str,
    interval: float = 0.02,
    error: type[Exception] = AssertionError,
):
    """Poll ``predicate`` until it returns a true value (returned); ``error`` naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)  # polling a condition (a file, a process) with a deadline


def write_whole(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` at once (rename): a process reading it meanwhile
    sees the old text or the new, never a half-written or empty file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def hold_at(gate: Path, commits: int = 0) -> None:
    """Hold ``exact_sum.py --pause-while gate`` at ``commits`` (0: where it is): training
    goes on up to that commit count and waits there until the gate moves or is removed.
    Written whole, so a worker never reads half a number."""
    write_whole(gate, str(commits))


def write_hosts(hosts_file: Path, hosts: str) -> None:
    """Replace the hosts file of ``hosts_file_discovery`` whole: a discovery run in the
    middle of a plain rewrite would read it empty and drop every host."""
    write_whole(hosts_file, hosts)


def formed_round_sizes(paths: Iterable[Path]) -> list[int]:
    """The sizes of the rounds the event files ``paths`` say formed, oldest first across
    the files (several nodes' drivers, each writing while it leads)."""
    formed = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text().splitlines():
                if '"round_formed"' in line:
                    event = json.loads(line)
                    formed.append((event["t"], event["size"]))
    return [size for _, size in sorted(formed)]


def committed(url: str, job_id: str) -> int:
    """The job's newest committed step (rank 0's progress record in the store at
    ``url``), 0 before any."""
    with open_store(url) as store:
        kv = store.get(JobKeys(job_id).progress)
    return ProgressRecord.from_json(kv.value).step if kv is not None else 0


def hosts_file_discovery(workdir: Path, hosts: str) -> tuple[Path, Path]:
    """A discovery script that prints a hosts file, and that file (holding ``hosts``):
    a test changes the job's hosts by rewriting the file."""
    hosts_file = Path(workdir) / "hosts.txt"
    write_hosts(hosts_file, hosts)
    script = Path(workdir) / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    script.chmod(0o755)
    return script, hosts_file


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


class ElasticRun:
    def __init__(
        self,
        args: list[str],
        workdir: Path,
        env: dict | None = None,
        host=None,
        wrapper: Sequence[str] = (),
    ):
        """``wrapper``: a command prefix the driver runs under (it execs the driver, so
        the pid is still the driver's: ``tests.support.hostile.limit_fds``)."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.events_path = self.workdir / "events.jsonl"
        self.out_path = self.workdir / "stdout.log"
        self.err_path = self.workdir / "stderr.log"
        self.argv = [
            *wrapper,
            *(sys.executable, "-m", "driver.cli", "--events", str(self.events_path), *args),
        ]
        self.host = host
        if host is not None:
            # nsenter (which waits for the driver and exits with its status) leads the
            # process group: stop() reaches both.
            self.argv = host.command(self.argv)
        # A driver that hangs prints every thread's stack on SIGABRT (``wait``).
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1", **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.progress = 0
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None

    def start(self) -> ElasticRun:
        # Open for the driver's life, closed by stop().
        self._out = open(self.out_path, "w")  # noqa: SIM115
        self._err = open(self.err_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None  # stdout=PIPE
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        return self

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self._out.write(line)
            self._out.flush()
            self._lines.append(line)
            m = _PROGRESS.search(line)
            if m:
                self.progress = max(self.progress, int(m.group(1)))

    def wait(self, timeout: float) -> int:
        """The driver's exit status; AssertionError (with its stderr) after ``timeout``."""
        assert self.proc is not None and self._reader is not None, "start() first"
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"elastic-run did not finish within {timeout:.0f}s:\n" + self._stacks()
            ) from None
        self._reader.join(timeout=10)
        return code

    def _stacks(self) -> str:
        """A hung job's threads, where each waits (faulthandler's dump on SIGABRT): the
        live workers' first (their stderr reaches the driver's, prefixed with their
        rank, while the driver still relays it), then the driver's, with the stderr
        before them."""
        assert self.proc is not None
        if self.host is not None:  # nsenter leads: the driver is its child
            return self.stderr_tail()
        workers = [pid for pid in self.worker_pids().values() if pid_alive(pid)]
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
        # their dumps relayed, or not at all: the driver's is wanted either way
        with contextlib.suppress(TimeoutError):
            wait_until(
                lambda: not any(pid_alive(p) for p in workers), 5, "dumps", error=TimeoutError
            )
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return self.stderr_tail(200)

    def wait_progress(self, at_least: int, timeout: float = 60) -> int:
        return wait_until(
            lambda: self.progress >= at_least and self.progress,
            timeout,
            f"progress {at_least} (at {self.progress}); stderr:\n{self.stderr_tail()}",
        )

    def output(self) -> str:
        """What the driver printed on stdout so far (the workers' prefixed lines)."""
        return "".join(self._lines)

    def wait_output(self, pattern: str, timeout: float = 60) -> re.Match:
        """The first match of regular expression ``pattern`` in the driver's stdout."""
        return wait_until(
            lambda: re.search(pattern, self.output(), re.MULTILINE),
            timeout,
            f"output matching {pattern!r}; stderr:\n{self.stderr_tail()}",
        )

    def events(self, kind: str | None = None) -> list[dict]:
        try:
            lines = self.events_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        records = [json.loads(line) for line in lines if line.strip()]
        return [r for r in records if kind is None or r["kind"] == kind]

    def wait_event(
        self, kind: str, predicate=lambda e: True, timeout: float = 60, after: int = 0
    ) -> dict:
        """The first event of ``kind`` (past the first ``after`` of that kind) that
        satisfies ``predicate``."""
        return wait_until(
            lambda: next((e for e in self.events(kind)[after:] if predicate(e)), None),
            timeout,
            f"event {kind}; stderr:\n{self.stderr_tail()}",
        )

    def current_round(self) -> dict | None:
        rounds = self.events("round_formed")
        return rounds[-1] if rounds else None

    def worker_pids(self) -> dict[str, int]:
        """Every worker this driver started or adopted (taking a job over), by id."""
        return {
            e["worker"]: e["pid"]
            for e in self.events()
            if e["kind"] in ("worker_started", "worker_adopted")
        }

    def members(self) -> list[str]:
        current = self.current_round()
        return list(current["members"]) if current else []

    def kill_member(self, rank: int, sig: int = signal.SIGKILL) -> str:
        """Send ``sig`` to the worker with ``rank`` in the current round; its worker id."""
        worker = self.members()[rank]
        os.kill(self.worker_pids()[worker], sig)
        return worker

    def stderr_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.err_path.read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # On a test host the events' pids are that host's: no pid of ours to signal.
        for pid in self.worker_pids().values() if self.host is None else ():
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        if self._reader is not None:
            self._reader.join(timeout=10)
        for f in (getattr(self, "_out", None), getattr(self, "_err", None)):
            if f is not None:
                f.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def run_cli(
    *args: str, timeout: float = 60, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``elastic-run ARGS`` to its end, from the repository's root (a start that is
    refused ends at once), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "driver.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def exact_sum_command(out_dir: Path, samples: int, epochs: int, *extra: str) -> list[str]:
    """The worker command of ``workloads/exact_sum.py`` (batches of 4)."""
    return [
        "python",
        str(EXACT_SUM),
        str(out_dir),
        "--samples",
        str(samples),
        "--epochs",
        str(epochs),
        "--batch",
        "4",
        *extra,
    ]


def exact_sum_results(out_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("*.json"))]


def check_exact_sum(
    out_dir: Path,
    samples: int,
    epochs: int,
    final_size: int | None = None,
    commits: int | None = None,
) -> list[dict]:
    """Every worker of the final round holds the identical, exact state."""
    results = exact_sum_results(out_dir)
    assert results, f"no worker wrote a result into {out_dir}"
    size = results[0]["size"]
    assert len(results) == size, f"{len(results)} results for a final round of {size}"
    assert sorted(r["rank"] for r in results) == list(range(size))
    if final_size is not None:
        assert size == final_size
    expected_total = epochs * samples * (samples - 1) / 2
    for r in results:
        assert r["visits_min"] == r["visits_max"] == epochs, f"not exactly once: {r}"
        assert r["total"] == expected_total, f"wrong total: {r}"
        assert r["epoch"] == epochs - 1
    keys = ("commits", "total", "digest", "sizes", "visits_sum")
    assert len({tuple(json.dumps(r[k]) for k in keys) for r in results}) == 1, (
        f"ranks disagree: {results}"
    )
    if commits is not None:
        assert results[0]["commits"] == commits
    return results


def read_store(url: str, read):
    """``read(store)`` through a client of the job's etcd, closed after."""
    store = open_store(url)
    try:
        return read(store)
    finally:
        store.close()


def agents(url: str, job_id: str) -> dict[str, AgentRecord]:
    """The job's live agents by host, as their records say."""
    kvs, _ = read_store(url, lambda store: store.get_prefix(JobKeys(job_id).agents))
    return {r.host: r for r in (AgentRecord.from_json(kv.value) for kv in kvs)}
