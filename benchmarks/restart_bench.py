"""A torchrun script restarted after a failure: ours (``elastic-run --restart-workers``)
beside torchrun, the same script unchanged under both.

The script is ``examples/torchrun/train_ddp.py`` (PyTorch's DDP tutorial's shape: gloo
from the environment, DDP, a DistributedSampler, its own checkpoint every epoch), run
with ``--log-every N``: each rank prints ``rank R/W restart C: step S, epoch E`` at its
first step after a start and every N steps, and ``rank R/W: restart C, starting at epoch
E`` once its process group is up and its checkpoint loaded. The benchmark reads the
lines as they come (timestamped on arrival: ours' come through the driver's output
forwarding, torchrun's straight from its workers, so ours pays that hop).

Failures (t0 = ``time.time()`` just before the failure; each configuration repeats it
``--failures`` times, waiting for a steady world first: every rank ``--settle-steps``
steps into it, and with spares every host's pool refilled):

* ``sigkill``: SIGKILL one worker of a world of 2 on this machine.
  - ours: ``elastic-run --restart-workers -np 2``; ``ours-spares``: the same with
    ``--spares 2`` (the new world's workers are warm spares that imported torch ahead
    of need: ``driver.programs.world_spare``);
  - torchrun: ``torchrun --nnodes 1:2 --nproc-per-node 2 --rdzv-backend c10d
    --rdzv-endpoint 127.0.0.1:PORT --max-restarts K`` (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
    as ``docs/DESIGN.md`` says). With ``--nnodes 1:2`` its agent's new rendezvous waits
    the c10d ``last_call_timeout`` for a second node (torch's default, 30 s,
    ``--torch-last-call``); ``--torch-nnodes 1`` measures a fixed world, which does not.
* ``hostcut`` (needs root: test hosts, ``benchmarks/harness/netns.py``): two workers on
  each of hosts A and B; B's link is cut (no FIN, no RST), then B comes back as a
  rebooted machine (its processes killed, its link restored) and the world grows back
  to 4 before the next cut.
  - ours: ``elastic-run --restart-workers -H A:2,B:2 -np 4 --min-np 2 --launcher ssh
    --blacklist-cooldown-range 20 20`` (``ours-spares``: and ``--spares 2``): B's
    agent's lease lapses (3 s), A's workers are stopped and a world of 2 starts on A; once B's cooldown is over (B is back by then)
    the world grows back to 4;
  - torchrun: one agent per host, ``--nnodes 1:2 --nproc-per-node 2 --rdzv-backend c10d
    --rdzv-endpoint A:29400 --local-addr <host>`` (``GLOO_SOCKET_IFNAME=eth0``): A's
    workers wait in their allreduce until the gloo timeout (the script's ``--timeout``,
    ``--torch-gloo-timeout``, 30 s here; torch's default is 30 min), fail, and A's agent
    restarts its group through a new rendezvous; B comes back as a fresh agent.

Definition (``median_s``, ``max_s``, ``samples``): from t0 until every rank of the
restarted world (2 ranks: the survivors' host's) printed its first step line (``step 1``:
only a process started after t0 prints it). Also, as medians (each failure's in
``phase_samples``): ``ready_s`` (t0 to the last rank's "starting at epoch" line of those
processes: imported, group formed, checkpoint loaded), and ours' ``world_stopping_s``
(t0 to the driver's ``world_stopping``: the failure seen) and ``world_started_s``.

One JSON line per configuration on stdout (nothing else):
    {"bench": "restart", "failure": "sigkill"|"hostcut",
     "system": "ours"|"ours-spares"|"torchrun",
     "command", "definition", "failures", "median_s", "max_s", "samples", ...phases...,
     "phase_samples", "settings", "load_avg"[, "error"]}

    python -m benchmarks.restart_bench [--failures 3] [--parts sigkill hostcut]
        [--systems ours ours-spares torchrun]        # hostcut: run as root
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from benchmarks.harness.jobs import ElasticRun, pid_alive
from benchmarks.harness.netns import HostsError, NetnsHost, NetnsHosts, running_hosts
from benchmarks.harness.paths import ROOT
from benchmarks.harness.processes import THREAD_ENV, free_port, kill_group
from benchmarks.harness.stats import load_avg, median_or_none
from benchmarks.harness.testhosts import RDZV_PORT, reap, require_root
from benchmarks.harness.waits import BenchTimeout, wait_for
from benchmarks.harness.workdir import bench_workdir

SCRIPT = ROOT / "examples" / "torchrun" / "train_ddp.py"
STEP = re.compile(r"rank (\d+)/(\d+) restart (\d+): step (\d+)")
READY = re.compile(r"rank (\d+)/(\d+): restart (\d+), starting at epoch (\d+)")
#: every wait has a deadline: torchrun's host cut waits out the gloo timeout and a last
#: call, then imports torch on a loaded machine
RECOVERY_DEADLINE = 240.0
STEADY_DEADLINE = 240.0
STOP_DEADLINE = 30.0
DEFINITION = (
    "failure -> every rank of the restarted world has printed its first step (a fresh "
    "process's 'step 1' line), resumed from the script's own checkpoint"
)


class Lines:
    """The step and ready lines of one output stream, with their arrival times
    (``feed`` from a reader thread; the queries from the benchmark's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.steps: list[tuple[float, int, int, int, int]] = []  # t, rank, world, restart, step
        self.ready: list[tuple[float, int, int]] = []  # t, rank, world

    def feed(self, line: str) -> None:
        """One line read; it may hold several workers' lines: torchrun's share one pipe
        and write unbuffered (``python -u``), a print's text and its newline apart, so
        two workers' texts can meet on one line (each text stays whole: one write)."""
        now = time.time()
        with self._lock:
            for step in STEP.finditer(line):
                rank, world, restart, n = (int(g) for g in step.groups())
                self.steps.append((now, rank, world, restart, n))
            for ready in READY.finditer(line):
                self.ready.append((now, int(ready.group(1)), int(ready.group(2))))

    def steady(self, size: int, settle: int, since: float) -> bool:
        """Every rank of a world of ``size`` is ``settle`` steps into it (lines after
        ``since``, when the world before had ended)."""
        with self._lock:
            latest: dict[int, tuple[int, int]] = {}
            for t, rank, world, _, n in self.steps:
                if t >= since:
                    latest[rank] = (world, n)
        return all(
            r in latest and latest[r] >= (size, settle) and latest[r][0] == size
            for r in range(size)
        )

    def first_steps(self, size: int, t0: float) -> dict[int, float] | None:
        """When each rank of a world of ``size`` printed its first step after ``t0``
        (None: not every rank yet)."""
        firsts: dict[int, float] = {}
        with self._lock:
            for t, rank, world, _, n in self.steps:
                if t >= t0 and n == 1 and world == size:
                    firsts.setdefault(rank, t)
        return firsts if len(firsts) >= size else None

    def ready_before(self, firsts: dict[int, float], t0: float) -> float | None:
        """When the last rank was ready (its group up, its checkpoint loaded) in the
        process that printed its first step at ``firsts[rank]``."""
        ready: dict[int, float] = {}
        with self._lock:
            for t, rank, _ in self.ready:
                if rank in firsts and t0 <= t <= firsts[rank]:
                    ready[rank] = t  # the latest before that step: the same process's
        return max(ready.values()) if len(ready) == len(firsts) else None


def read_into(stream: IO[str], lines: Lines, copy: IO[str]) -> threading.Thread:
    """A thread feeding ``lines`` from ``stream`` (and copying it to ``copy``)."""

    def run() -> None:
        for line in stream:
            lines.feed(line)
            copy.write(line)
        copy.flush()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


class TimedRun(ElasticRun):
    """``ElasticRun`` whose stdout lines (the workers', forwarded) are timestamped."""

    def __init__(self, args: list[str], workdir: Path, env: dict | None = None):
        super().__init__(args, workdir, env=env)
        self.lines = Lines()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self.lines.feed(line)
            self._out.write(line)
            self._out.flush()
            self._lines.append(line)


def script_args(ckpt: Path, args: argparse.Namespace, timeout: float | None) -> list[str]:
    return [
        *(str(SCRIPT), str(ckpt), "--epochs", "100000", "--log-every", str(args.log_every)),
        *(("--timeout", f"{timeout:g}") if timeout else ()),
    ]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc: children of each thread)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    kids = [int(p) for p in f.read().split()]
                found += kids
                todo += kids
    return found


def spare_args(spares: int) -> list[str]:
    """Ours' flags for ``spares`` warm spares per host (none: no flag)."""
    return ["--spares", str(spares)] if spares else []


def ours_name(spares: int) -> str:
    return "ours-spares" if spares else "ours"


def result_line(failure: str, system: str, command: Sequence[str], settings: dict) -> dict:
    return {
        "bench": "restart",
        "failure": failure,
        "system": system,
        "command": list(command),
        "definition": DEFINITION,
        "settings": settings,
    }


def finish_line(result: dict, samples: list[float], phases: dict[str, list]) -> dict:
    result.update(
        failures=len(samples),
        median_s=round(statistics.median(samples), 3) if samples else None,
        max_s=round(max(samples), 3) if samples else None,
        samples=[round(s, 3) for s in samples],
        **{f"{name}_s": median_or_none(values) for name, values in phases.items()},
        phase_samples={
            name: [None if v is None else round(v, 3) for v in values]
            for name, values in phases.items()
        },
        load_avg=load_avg(),
    )
    return result


def measure(
    lines: Lines,
    size: int,
    t0: float,
    check: Callable[[], None],
    what: str,
) -> tuple[float, float | None]:
    """(recovery, ready) seconds after ``t0`` for a restarted world of ``size``."""

    def done() -> dict[int, float] | None:
        check()
        return lines.first_steps(size, t0)

    firsts = wait_for(done, RECOVERY_DEADLINE, what)
    ready = lines.ready_before(firsts, t0)
    return max(firsts.values()) - t0, None if ready is None else ready - t0


def until_steady(
    lines: Lines, size: int, settle: int, since: float, check: Callable[[], None]
) -> None:
    """Wait until every rank of a world of ``size`` is ``settle`` steps into it.

    Raises:
        BenchTimeout: not within ``STEADY_DEADLINE``, or the job ended (``check``).
    """

    def steady() -> bool:
        check()
        return lines.steady(size, settle, since)

    wait_for(steady, STEADY_DEADLINE, f"a steady world of {size}")


def idle_spares(run: ElasticRun) -> int:
    """Spares registered and waiting now, from the driver's events: ready, neither
    promoted nor gone since."""
    ready, gone = set(), set()
    for e in run.events():
        if e["kind"] == "spare_ready":
            ready.add(e["worker"])
        elif e["kind"] in ("spare_promoted", "spare_lost", "worker_stopped", "worker_exited"):
            gone.add(e["worker"])
    return len(ready - gone)


def until_spares(run: ElasticRun, spares: int, check: Callable[[], None]) -> None:
    """Wait until ``spares`` spares are idle (none asked for: at once): each failure
    of ``ours-spares`` comes in the steady state of a job whose pool has refilled.

    Raises:
        BenchTimeout: not within ``STEADY_DEADLINE``, or the job ended (``check``).
    """

    def refilled() -> bool:
        check()
        return idle_spares(run) >= spares

    wait_for(refilled, STEADY_DEADLINE, f"{spares} idle spares")


def first_event(run: ElasticRun, kind: str, t0: float) -> float | None:
    event = next((e for e in run.events(kind) if e["t"] >= t0), None)
    return None if event is None else event["t"] - t0


# --------------------------------------------------------------------------- sigkill


def sigkill_ours(args: argparse.Namespace, tmp: Path, rng: random.Random, spares: int = 0) -> dict:
    job_args = ["--restart-workers", "-np", "2", *spare_args(spares), "python"]
    command = [*job_args, *script_args(tmp / f"ours{spares}-ckpt", args, None)]
    result = result_line("sigkill", ours_name(spares), ["elastic-run", *command], {})
    samples: list[float] = []
    phases: dict[str, list] = {"ready": [], "world_stopping": [], "world_started": []}
    run = TimedRun(command, tmp / f"ours{spares}-sigkill", env={**os.environ, **THREAD_ENV})

    def check() -> None:
        assert run.proc is not None
        if run.proc.poll() is not None:
            raise BenchTimeout(f"elastic-run exited with {run.proc.returncode}")

    try:
        run.start()
        since = 0.0
        for n in range(args.failures):
            until_steady(run.lines, 2, args.settle_steps, since, check)
            until_spares(run, spares, check)  # both of the host's (0: none asked for)
            world = run.events("world_started")[-1]
            victim = run.worker_pids()[rng.choice(world["members"])]
            t0 = time.time()
            os.kill(victim, signal.SIGKILL)
            took, ready = measure(run.lines, 2, t0, check, f"recovery from SIGKILL {n + 1}")
            samples.append(took)
            phases["ready"].append(ready)
            phases["world_stopping"].append(first_event(run, "world_stopping", t0))
            phases["world_started"].append(first_event(run, "world_started", t0))
            since = t0
    except BenchTimeout as exc:
        result["error"] = str(exc)
    finally:
        run.stop()
    return finish_line(result, samples, phases)


class TorchrunLocal:
    """``torchrun`` on this machine in its own session, its stdout read line by line."""

    def __init__(self, args: argparse.Namespace, workdir: Path):
        workdir.mkdir(parents=True)
        self.workdir = workdir
        self.argv = [
            *(sys.executable, "-m", "torch.distributed.run", f"--nnodes={args.torch_nnodes}"),
            *("--nproc-per-node=2", f"--max-restarts={args.failures + 3}"),
            *("--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"),
            f"--rdzv-conf=last_call_timeout={args.torch_last_call}",
            *script_args(workdir / "ckpt", args, None),
        ]
        # Without it a restarted gloo group on one node reads the dead workers'
        # addresses from the agent's shared store and usually hangs (pytorch #135712).
        self.env = {**os.environ, **THREAD_ENV, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        self.lines = Lines()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self._out = open(self.workdir / "stdout.log", "w")  # noqa: SIM115 (closed in stop)
        self._err = open(self.workdir / "stderr.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self._reader = read_into(self.proc.stdout, self.lines, self._out)

    def check(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise BenchTimeout(f"torchrun exited with {self.proc.returncode}")

    def workers(self) -> list[int]:
        assert self.proc is not None
        return descendants(self.proc.pid)

    def stop(self) -> None:
        if self.proc is None:
            return
        strays = self.workers()
        if self.proc.poll() is None:
            kill_group(self.proc.pid, signal.SIGTERM)  # the agent stops its workers
            try:
                self.proc.wait(timeout=STOP_DEADLINE)
            except subprocess.TimeoutExpired:
                kill_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        for pid in strays:
            if pid_alive(pid):
                kill_group(pid)
        self._reader.join(timeout=10)
        self._out.close()
        self._err.close()


def sigkill_torchrun(args: argparse.Namespace, tmp: Path, rng: random.Random) -> dict:
    job = TorchrunLocal(args, tmp / "torchrun-sigkill")
    settings = {
        "nnodes": args.torch_nnodes,
        "last_call_timeout_s": args.torch_last_call,
        "max_restarts": args.failures + 3,
    }
    result = result_line("sigkill", "torchrun", ["torchrun", *job.argv[3:]], settings)
    samples: list[float] = []
    phases: dict[str, list] = {"ready": []}
    try:
        job.start()
        since = 0.0
        for n in range(args.failures):
            until_steady(job.lines, 2, args.settle_steps, since, job.check)
            victim = rng.choice(job.workers())
            t0 = time.time()
            os.kill(victim, signal.SIGKILL)
            took, ready = measure(job.lines, 2, t0, job.check, f"recovery from SIGKILL {n + 1}")
            samples.append(took)
            phases["ready"].append(ready)
            since = t0
    except BenchTimeout as exc:
        result["error"] = str(exc)
    finally:
        job.stop()
    return finish_line(result, samples, phases)


# --------------------------------------------------------------------------- host cut


def hostcut_ours(hosts: NetnsHosts, args: argparse.Namespace, tmp: Path, spares: int = 0) -> dict:
    a, b = hosts[0], hosts[1]
    job_args = [
        *("--restart-workers", "-H", f"{a.address}:2,{b.address}:2", "-np", "4"),
        *spare_args(spares),
        # B stays out until A's world has recovered, then comes back (restored by then)
        *("--min-np", "2", "--launcher", "ssh", "--blacklist-cooldown-range", "20", "20"),
    ]
    command = [*job_args, "python", *script_args(tmp / f"ours{spares}-cut-ckpt", args, None)]
    result = result_line("hostcut", ours_name(spares), ["elastic-run", *command], {})
    samples: list[float] = []
    phases: dict[str, list] = {"ready": [], "world_stopping": [], "world_started": []}
    run = TimedRun(command, tmp / f"ours{spares}-hostcut", env={**hosts.env(), **THREAD_ENV})

    def check() -> None:
        assert run.proc is not None
        if run.proc.poll() is not None:
            raise BenchTimeout(f"elastic-run exited with {run.proc.returncode}")

    try:
        run.start()
        since = 0.0
        for n in range(args.failures):
            until_steady(run.lines, 4, args.settle_steps, since, check)
            until_spares(run, 2 * spares, check)  # A's and B's
            t0 = time.time()
            b.cut()
            try:
                took, ready = measure(run.lines, 2, t0, check, f"recovery from cut {n + 1}")
            finally:
                reap(b)  # a rebooted machine: nothing of B's old processes comes back
                b.restore()
            samples.append(took)
            phases["ready"].append(ready)
            phases["world_stopping"].append(first_event(run, "world_stopping", t0))
            phases["world_started"].append(first_event(run, "world_started", t0))
            since = time.time()
    except BenchTimeout as exc:
        result["error"] = str(exc)
    finally:
        b.restore()
        run.stop()
        reap(a, b)
    return finish_line(result, samples, phases)


class TorchrunOnHosts:
    """One torchrun agent per test host, each one's stdout (its workers') read."""

    def __init__(self, a: NetnsHost, b: NetnsHost, args: argparse.Namespace, workdir: Path):
        workdir.mkdir(parents=True)
        self.a, self.b, self.args, self.workdir = a, b, args, workdir
        self.lines = Lines()
        self.agents: list[tuple[NetnsHost, subprocess.Popen, IO[str]]] = []
        self.env = {
            **os.environ,
            **THREAD_ENV,
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "GLOO_SOCKET_IFNAME": "eth0",  # the hosts' names resolve nowhere
        }
        self._readers: list[threading.Thread] = []

    def argv(self, host: NetnsHost) -> list[str]:
        conf = f"is_host={int(host is self.a)},last_call_timeout={self.args.torch_last_call}"
        return [
            *(sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2"),
            *("--nproc-per-node=2", f"--max-restarts={self.args.failures + 3}"),
            *("--rdzv-backend=c10d", f"--rdzv-endpoint={self.a.address}:{RDZV_PORT}"),
            *("--rdzv-id=restart-bench", f"--rdzv-conf={conf}", f"--local-addr={host.address}"),
            *script_args(self.workdir / "ckpt", self.args, self.args.torch_gloo_timeout),
        ]

    def start_agent(self, host: NetnsHost) -> None:
        log = open(self.workdir / f"agent{len(self.agents)}-{host.name}.log", "w")  # noqa: SIM115
        proc = host.popen(
            self.argv(host),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        assert proc.stdout is not None
        self._readers.append(read_into(proc.stdout, self.lines, log))
        self.agents.append((host, proc, log))

    def check(self) -> None:
        code = self.agents[0][1].poll()
        if code is not None:
            raise BenchTimeout(f"the torchrun agent on A exited with {code}")

    def stop(self) -> None:
        for _, proc, _ in self.agents:
            if proc.poll() is None:
                kill_group(proc.pid, signal.SIGTERM)
        for _, proc, _ in self.agents:
            try:
                proc.wait(timeout=STOP_DEADLINE)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        reap(self.a, self.b)
        for thread in self._readers:
            thread.join(timeout=10)
        for _, _, log in self.agents:
            log.close()


def hostcut_torchrun(hosts: NetnsHosts, args: argparse.Namespace, tmp: Path) -> dict:
    a, b = hosts[0], hosts[1]
    job = TorchrunOnHosts(a, b, args, tmp / "torchrun-hostcut")
    settings = {
        "gloo_timeout_s": args.torch_gloo_timeout,
        "last_call_timeout_s": args.torch_last_call,
        "max_restarts": args.failures + 3,
    }
    result = result_line("hostcut", "torchrun", ["torchrun", *job.argv(a)[3:]], settings)
    samples: list[float] = []
    phases: dict[str, list] = {"ready": []}
    try:
        job.start_agent(a)
        job.start_agent(b)
        since = 0.0
        for n in range(args.failures):
            until_steady(job.lines, 4, args.settle_steps, since, job.check)
            t0 = time.time()
            b.cut()
            try:
                took, ready = measure(job.lines, 2, t0, job.check, f"recovery from cut {n + 1}")
            finally:
                reap(b)  # a rebooted machine: nothing of B's old processes comes back
                b.restore()
            samples.append(took)
            phases["ready"].append(ready)
            since = time.time()
            job.start_agent(b)  # B's agent after the reboot: it joins as a waiting node
    except BenchTimeout as exc:
        result["error"] = str(exc)
    finally:
        b.restore()
        job.stop()
    return finish_line(result, samples, phases)


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--failures", type=int, default=3, help="failures per configuration")
    ap.add_argument(
        "--parts", nargs="+", default=["sigkill", "hostcut"], choices=["sigkill", "hostcut"]
    )
    ap.add_argument(
        "--systems",
        nargs="+",
        default=["ours", "ours-spares", "torchrun"],
        choices=["ours", "ours-spares", "torchrun"],
        help="ours-spares: ours with --spares 2 (each host keeps two warm spares)",
    )
    ap.add_argument(
        "--settle-steps", type=int, default=30, help="steps of every rank before a failure"
    )
    ap.add_argument("--log-every", type=int, default=10, help="the script's --log-every")
    ap.add_argument(
        "--torch-nnodes",
        default="1:2",
        help="sigkill: torchrun's --nnodes (1:2 waits the last call at each restart; "
        "1 is a fixed world that does not)",
    )
    ap.add_argument(
        "--torch-last-call",
        type=int,
        default=30,
        help="torchrun: c10d last_call_timeout, s (torch's default)",
    )
    ap.add_argument(
        "--torch-gloo-timeout",
        type=float,
        default=30.0,
        help="torchrun host cut: the script's --timeout, s",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the jobs' logs (path on stderr)")
    args = ap.parse_args()
    if args.failures < 1 or args.settle_steps < 1 or args.log_every < 1:
        ap.error("--failures, --settle-steps and --log-every must be at least 1")
    if "hostcut" in args.parts:
        require_root("restart_bench")
    rng = random.Random(args.seed)
    runs: dict[str, Callable[..., dict[str, Any]]] = {
        "ours": sigkill_ours,
        "ours-spares": functools.partial(sigkill_ours, spares=2),
        "torchrun": sigkill_torchrun,
    }
    cuts: dict[str, Callable[..., dict[str, Any]]] = {
        "ours": hostcut_ours,
        "ours-spares": functools.partial(hostcut_ours, spares=2),
        "torchrun": hostcut_torchrun,
    }
    with bench_workdir("restart-bench-", args.keep) as tmp:
        if "sigkill" in args.parts:
            for system in args.systems:
                print(json.dumps(runs[system](args, tmp, rng)), flush=True)
        if "hostcut" in args.parts:
            try:
                with running_hosts(3, tmp / "hosts") as hosts:
                    hosts.quick_resolver()
                    for system in args.systems:
                        print(json.dumps(cuts[system](hosts, args, tmp)), flush=True)
            except HostsError as exc:
                sys.exit(f"restart_bench: cannot make the test hosts: {exc}")


if __name__ == "__main__":
    main()
