"""Host cut to the survivors' next commit: ours (embedded store, etcd) beside torchrun.

**Needs root** (the test hosts are network, PID and mount namespaces; run it with sudo and
the project's Python), iproute2, util-linux and openssh-server (``scripts/test``
installs them), ``etcd`` for the ``etcd`` configuration and torch for ``torchrun``; it
ends with a one-line error when one is missing. Nothing else: it runs from a fresh
checkout (the workers run this checkout's code through ``PYTHONPATH``).

Three test hosts (``benchmarks/harness/netns.py``: each its own network, UTS, PID and
mount namespace and its own sshd). A and B run the workers, two each; C
runs the single etcd member of the ``etcd`` configuration. The benchmark, and with it
ours' driver and embedded store, runs here, on the hosts' bridge. Training is
``workloads/steps.py`` (ours) or ``workloads/torch_steps.py`` (torchrun): each step some
compute, one allreduce and a commit whose wall-clock time is logged with its round.

Once the world is steady (4 workers in one round, each with ``--settle-steps`` commits in
it), B's link is cut (``NetnsHost.cut``: its veth goes down, packets are dropped, nobody
gets a FIN or an RST, B's processes keep running), t0 = ``time.time()`` just before the
cut (every namespace reads the same clock).

Definition (``stall_s``; the samples): from t0 until every survivor (the workers on A
when B was cut) has committed a step in a round newer than the one B was cut in; for
torchrun, until every worker of the group the agent on A restarted has committed a step
(a worker group plays the part of a round: its id is agreed when it forms). A step that
completes in the old round after the cut does not count. A cut after which the
survivors do not commit within ``--recovery-deadline`` ends the configuration with an
``error`` naming the cut, and the samples so far.

One job per configuration; the world is put back to 4 between cuts:

* ours, ``elastic-run -H A:2,B:2 -np 4 --min-np 2 --launcher ssh
  --blacklist-cooldown-range 1 2`` (``--rendezvous etcd://C:2379`` for ``etcd``): B's
  link is restored once the survivors have committed; B's stale workers end on their
  own and the driver takes B back after its cooldown as fresh workers.
* torchrun, one agent per host (``python -m torch.distributed.run --nnodes=1:2
  --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=A:29400
  --max-restarts=<cuts + 3> --local-addr=<the host's address>``, each started on its
  host; ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` as ``docs/DESIGN.md`` says,
  ``GLOO_SOCKET_IFNAME=eth0`` as on any machine whose host name does not resolve to its
  address; the rendezvous store lives in the agent on A, which survives). Torchrun has
  no failure detector of its own for a silent peer: the survivors wait in the gloo
  allreduce until the gloo timeout, fail, and their agent restarts the group through a
  new rendezvous (which drops B once its keep-alives are older than 5 s x 3, then waits
  the last-call time for more nodes). Used: gloo timeout ``--torch-gloo-timeout`` (30 s;
  torch's own default is 1800 s), the c10d rendezvous at torch's defaults (join 600 s,
  last call ``--torch-last-call`` 30 s, close 30 s, keep-alive every 5 s, 3 missed, store
  read timeout 60 s), monitor interval 0.1 s; all are in the JSON line. Once the
  survivors have committed, B comes back as a rebooted machine: its processes are
  killed, its link restored and a fresh agent started; it joins as a waiting node and
  the agent on A restarts the group with 4 workers.

Also reported, as medians over the cuts: ours ``silent_report_s`` (t0 to the first
``failure_reported`` of a silent peer), ``host_unreachable_s`` (to the driver's
``host_unreachable`` for B: its probe went unanswered) and ``round_formed_s`` (to the
``round_formed`` of the next round); torchrun ``collective_failed_s`` (to the last
survivor's allreduce raising: the gloo timeout), ``restarted_s`` (to the last worker of
the restarted group running the script) and ``ready_s`` (... with its gloo group up and
the checkpoint loaded).

Each configuration is bounded by ``--config-time-limit``; every wait has a deadline and
every process is reaped (the hosts' by their PID namespaces). One JSON line per
configuration on stdout (nothing else):
    {"bench": "hostcut", "system": "ours"|"torchrun", "store": "embedded"|"etcd"|"c10d",
     "hosts": "A:2,B:2", "cuts", "definition", "median_s", "p90_s", "max_s", "samples",
     ...phase medians..., "phase_samples" (each phase, cut by cut), "settings", "job_exit",
     "load_avg_at_cuts" (just after each recovery), "load_avg" (at the end)[, "error"]}

    sudo python -m benchmarks.hostcut_bench [--cuts 5] [--configs embedded etcd torchrun]
    sudo python -m benchmarks.hostcut_bench --cuts 1 --configs embedded   # about a minute
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from benchmarks.harness.commits import CommitLog
from benchmarks.harness.etcd_cluster import EtcdCluster
from benchmarks.harness.netns import HostsError, NetnsHost, NetnsHosts, running_hosts
from benchmarks.harness.ours import OursJob
from benchmarks.harness.paths import TORCH_STEPS
from benchmarks.harness.processes import THREAD_ENV
from benchmarks.harness.stats import load_avg, median_or_none, summary
from benchmarks.harness.testhosts import RDZV_PORT, reap, require_root, require_tools
from benchmarks.harness.waits import FINISH_DEADLINE, STEADY_DEADLINE, BenchTimeout, wait_for
from benchmarks.harness.workdir import bench_workdir

CONFIGS = ("embedded", "etcd", "torchrun")
SLOTS = 2  # workers per host
WORLD = 2 * SLOTS

DEFINITIONS = {
    "ours": "B's link cut -> every survivor on A has committed a step in a round newer "
    "than the one B was cut in",
    "torchrun": "B's link cut -> every worker of the group the agent on A restarted has "
    "committed a step (resumed from the per-step checkpoint)",
}


class TimeLimit:
    """The configuration's time budget: ``wait`` is ``wait_for`` cut short by it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """``wait_for(predicate, timeout, what)`` within the budget.

        Raises:
            BenchTimeout: ``timeout`` passed, or the budget ran out first (said so).
        """
        left = self.end - time.monotonic()
        if left < timeout:
            what += f" (within the configuration's time limit of {self.seconds:.0f}s)"
        return wait_for(predicate, max(0.0, min(timeout, left)), what)


def seconds_after(t0: float, record: dict | None) -> float | None:
    return record["t"] - t0 if record is not None else None


def last_after(t0: float, records: list[dict | None]) -> float | None:
    """Seconds from ``t0`` to the latest of ``records``; None if any is missing."""
    if not records or any(r is None for r in records):
        return None
    return max(r["t"] for r in records if r is not None) - t0


def result_line(system: str, store: str, cuts: int, settings: dict) -> dict:
    return {
        "bench": "hostcut",
        "system": system,
        "store": store,
        "hosts": f"A:{SLOTS},B:{SLOTS}",
        "cuts_asked": cuts,
        "definition": DEFINITIONS[system],
        "settings": settings,
    }


def finish_line(
    result: dict, samples: list[float], phases: dict[str, list], loads: list[float]
) -> dict:
    result.update(
        cuts=len(samples),
        **summary(samples),
        **{f"{name}_s": median_or_none(values) for name, values in phases.items()},
        phase_samples={
            name: [None if v is None else round(v, 4) for v in values]
            for name, values in phases.items()
        },
        load_avg_at_cuts=loads,
        load_avg=load_avg(),
    )
    return result


# --------------------------------------------------------------------------- ours


def ours_config(store: str, hosts: NetnsHosts, args: argparse.Namespace, tmp: Path) -> dict:
    a, b, c = hosts[0], hosts[1], hosts[2]
    limit = TimeLimit(args.config_time_limit)
    job_args = [
        *("-H", f"{a.address}:{SLOTS},{b.address}:{SLOTS}", "-np", str(WORLD), "--min-np", "2"),
        *("--launcher", "ssh", "--blacklist-cooldown-range", *(f"{x:g}" for x in args.cooldown)),
    ]
    result = result_line("ours", store, args.cuts, {"elastic_run_args": job_args})
    samples: list[float] = []
    phases: dict[str, list] = defaultdict(list)
    loads: list[float] = []  # the load average just after each cut's recovery
    cluster: EtcdCluster | None = None
    job: OursJob | None = None
    try:
        if store == "etcd":
            cluster = EtcdCluster(1, tmp / "etcd", hosts=[c]).start()
            job_args += ["--rendezvous", cluster.url]
        job = OursJob(
            job_args,
            tmp / f"ours-{store}",
            args.work,
            env={"ELASTIC_SSH_OPTIONS": hosts.ssh_options},
            local=False,
        ).start()
        for cut in range(1, args.cuts + 1):
            samples.append(cut_ours(job, b, cut, args, limit, phases))
            loads.append(load_avg())
        result["job_exit"] = job.finish()
    except (BenchTimeout, RuntimeError) as exc:  # RuntimeError: the etcd member did not start
        result["error"] = str(exc)
    finally:
        b.restore()
        if job is not None:
            job.stop()
        reap(a, b)
        if cluster is not None:
            cluster.stop()
    return finish_line(result, samples, phases, loads)


def cut_ours(
    job: OursJob,
    b: NetnsHost,
    cut: int,
    args: argparse.Namespace,
    limit: TimeLimit,
    phases: dict[str, list],
) -> float:
    """Wait for a steady round of 4, cut B, wait for the survivors' commit in a newer
    round, restore B; the stall (the phases are appended to ``phases``).

    Raises:
        BenchTimeout: no steady round, or no recovery, in time; the job ended.
    """
    current = limit.wait(
        lambda: job.steady(WORLD, args.settle_steps), STEADY_DEADLINE, "a steady round of 4"
    )
    round_id = current["round"]
    on_b = {e["worker"] for e in job.run.events("worker_started") if e["host"] == b.address}
    survivors = [m for m in current["members"] if m not in on_b]

    def recovered(t0: float) -> float | None:
        job.check_running()
        job.log.poll()
        times = [job.log.first_commit_after(m, round_id, t0) for m in survivors]
        return None if None in times else max(t for t in times if t is not None)

    def first(kind: str, t0: float, match: Callable[[dict], bool]) -> dict | None:
        return next((e for e in job.run.events(kind) if e["t"] >= t0 and match(e)), None)

    t0 = time.time()
    b.cut()
    try:
        done = limit.wait(
            lambda: recovered(t0),
            args.recovery_deadline,
            f"the survivors' commit in a newer round after cut {cut}",
        )
    finally:
        b.restore()
    silent = first("failure_reported", t0, lambda e: str(e["reason"]).startswith("silent"))
    lost = first("host_unreachable", t0, lambda e: e["host"] == b.address)
    formed = first("round_formed", t0, lambda e: e["round"] > round_id)
    phases["silent_report"].append(seconds_after(t0, silent))
    phases["host_unreachable"].append(seconds_after(t0, lost))
    phases["round_formed"].append(seconds_after(t0, formed))
    return done - t0


# --------------------------------------------------------------------------- torchrun


class TorchrunOnHosts:
    """One torchrun agent per test host running ``workloads/torch_steps.py``; worker
    groups are told apart by the id they agree on (``CommitLog(round_field="group")``).

    The Popen of an agent is ``nsenter`` (its session leader); ``stop()`` ends the agents
    and then reaps every process of both hosts."""

    def __init__(self, a: NetnsHost, b: NetnsHost, workdir: Path, args: argparse.Namespace):
        self.a, self.b = a, b
        self.workdir = workdir
        self.out = workdir / "out"
        self.out.mkdir(parents=True)
        self.log = CommitLog(self.out, round_field="group")
        self.max_restarts = args.cuts + 3
        self.gloo_timeout = args.torch_gloo_timeout
        self.work = args.work
        self.rdzv = {
            "join_timeout": 600,
            "last_call_timeout": args.torch_last_call,
            "close_timeout": 30,
            "keep_alive_interval": 5,
            "keep_alive_max_attempt": 3,
            "read_timeout": 60,
        }
        self.env = {
            **os.environ,
            **THREAD_ENV,
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "GLOO_SOCKET_IFNAME": "eth0",
        }
        self.agents: list[tuple[NetnsHost, subprocess.Popen]] = []
        self._files: list[IO[str]] = []

    @property
    def settings(self) -> dict:
        return {
            "gloo_timeout_s": self.gloo_timeout,
            "rdzv_conf": self.rdzv,
            "max_restarts": self.max_restarts,
            "monitor_interval_s": 0.1,
        }

    def agent_argv(self, host: NetnsHost) -> list[str]:
        conf = {"is_host": int(host is self.a), **self.rdzv}
        return [
            *(sys.executable, "-m", "torch.distributed.run"),
            *("--nnodes=1:2", f"--nproc-per-node={SLOTS}", f"--max-restarts={self.max_restarts}"),
            *("--rdzv-backend=c10d", f"--rdzv-endpoint={self.a.address}:{RDZV_PORT}"),
            *("--rdzv-id=hostcut", "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in conf.items())),
            *("--monitor-interval=0.1", f"--local-addr={host.address}"),
            *(str(TORCH_STEPS), str(self.out), "--work", str(self.work)),
            *("--timeout", f"{self.gloo_timeout:g}"),
        ]

    def start_agent(self, host: NetnsHost) -> None:
        log = open(self.workdir / f"agent{len(self.agents)}-{host.name}.log", "w")  # noqa: SIM115
        self._files.append(log)  # open until stop(): the agent writes to it
        proc = host.popen(
            self.agent_argv(host),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.agents.append((host, proc))

    def start(self) -> TorchrunOnHosts:
        self.start_agent(self.a)
        self.start_agent(self.b)
        return self

    def agent_tail(self, index: int, lines: int = 5) -> str:
        host, _ = self.agents[index]
        path = self.workdir / f"agent{index}-{host.name}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def check_running(self) -> None:
        """BenchTimeout at once if the agent on A (the survivor) ended."""
        code = self.agents[0][1].poll()
        if code is not None:
            raise BenchTimeout(f"the torchrun agent on A exited with {code}: {self.agent_tail(0)}")

    def groups(self) -> dict[float, dict[str, dict]]:
        """group id -> {log key: "ready" record} of the workers that reached it."""
        out: dict[float, dict[str, dict]] = defaultdict(dict)
        for key, recs in self.log.records.items():
            ready = next((r for r in recs if r["ev"] == "ready"), None)
            if ready is not None:
                out[ready["group"]][key] = ready
        return out

    def steady(self, settle: int) -> tuple[float, dict[str, dict]] | None:
        """(group id, members) of the newest group when it has all 4 workers, each with
        ``settle`` commits in it; else None."""
        self.check_running()
        self.log.poll()
        groups = self.groups()
        if not groups:
            return None
        group = max(groups)
        members = groups[group]
        if len(members) != WORLD:
            return None
        if all(self.log.count_in_round(key, group) >= settle for key in members):
            return group, members
        return None

    def recovered(self, group: float, t0: float) -> tuple[float, dict[str, dict]] | None:
        """(time of the last first commit, members) of a group newer than ``group`` whose
        every worker has committed since ``t0``; None if none yet."""
        self.check_running()
        self.log.poll()
        for newer, members in sorted(self.groups().items()):
            size = next(iter(members.values()))["size"]
            if newer <= group or len(members) != size:
                continue
            times = [self.log.first_commit_after(key, group, t0) for key in members]
            if None not in times:
                return max(t for t in times if t is not None), members
        return None

    def finish(self) -> int | None:
        """End the job through the stop file; the agent on A's exit status (None if it
        had to be stopped)."""
        (self.out / "stop").touch()
        try:
            return self.agents[0][1].wait(timeout=FINISH_DEADLINE)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        for _, proc in self.agents:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)  # the agent stops its workers
        for _, proc in self.agents:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        reap(self.a, self.b)
        for _, proc in self.agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for f in self._files:
            f.close()


def torchrun_config(hosts: NetnsHosts, args: argparse.Namespace, tmp: Path) -> dict:
    a, b = hosts[0], hosts[1]
    limit = TimeLimit(args.config_time_limit)
    job = TorchrunOnHosts(a, b, tmp / "torchrun", args)
    result = result_line("torchrun", "c10d", args.cuts, job.settings)
    samples: list[float] = []
    phases: dict[str, list] = defaultdict(list)
    loads: list[float] = []  # the load average just after each cut's recovery
    try:
        job.start()
        for cut in range(1, args.cuts + 1):
            samples.append(cut_torchrun(job, cut, args, limit, phases))
            loads.append(load_avg())
        result["job_exit"] = job.finish()
    except BenchTimeout as exc:
        result["error"] = str(exc)
    finally:
        b.restore()
        job.stop()
    return finish_line(result, samples, phases, loads)


def cut_torchrun(
    job: TorchrunOnHosts,
    cut: int,
    args: argparse.Namespace,
    limit: TimeLimit,
    phases: dict[str, list],
) -> float:
    """Wait for a steady group of 4, cut B, wait for the restarted group's commits, then
    bring B back rebooted (a fresh agent); the stall (phases appended to ``phases``).

    Raises:
        BenchTimeout: no steady group, or no recovery, in time; the agent on A ended.
    """
    group, members = limit.wait(
        lambda: job.steady(args.settle_steps), STEADY_DEADLINE, "a steady group of 4"
    )
    survivors = [key for key, ready in members.items() if ready["host"] == job.a.name]
    t0 = time.time()
    job.b.cut()
    try:
        done, restarted = limit.wait(
            lambda: job.recovered(group, t0),
            args.recovery_deadline,
            f"the restarted group's commit after cut {cut}",
        )
    finally:
        reap(job.b)  # a rebooted machine: nothing of B's old processes comes back
        job.b.restore()
    phases["collective_failed"].append(
        last_after(t0, [job.log.event(key, "failed") for key in survivors])
    )
    phases["restarted"].append(last_after(t0, [job.log.event(key, "start") for key in restarted]))
    phases["ready"].append(last_after(t0, list(restarted.values())))
    job.start_agent(job.b)
    return done - t0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Needs root (test hosts are namespaces). Prints one JSON line per configuration.",
    )
    ap.add_argument("--cuts", type=int, default=5, help="host cuts per configuration")
    ap.add_argument(
        "--configs",
        nargs="+",
        default=list(CONFIGS),
        choices=CONFIGS,
        help="ours with the embedded store, ours with etcd on host C, torchrun (default: all)",
    )
    ap.add_argument(
        "--settle-steps",
        type=int,
        default=20,
        help="commits every worker makes in a round of 4 before the next cut",
    )
    ap.add_argument(
        "--work", type=int, default=160, help="side of the matrix product each step computes"
    )
    ap.add_argument(
        "--cooldown",
        type=float,
        nargs=2,
        default=[1.0, 2.0],
        metavar=("MIN", "MAX"),
        help="ours' --blacklist-cooldown-range: how soon B is taken back after a cut",
    )
    ap.add_argument(
        "--recovery-deadline",
        type=float,
        default=180.0,
        help="seconds a cut may take to recover before the configuration ends as failed",
    )
    ap.add_argument(
        "--config-time-limit",
        type=float,
        default=900.0,
        help="seconds one configuration may take in all (the run: this times the "
        "configurations, plus making the hosts)",
    )
    ap.add_argument(
        "--torch-gloo-timeout",
        type=float,
        default=30.0,
        help="torchrun: the gloo timeout the workers pass to init_process_group",
    )
    ap.add_argument(
        "--torch-last-call",
        type=int,
        default=30,
        help="torchrun: the c10d rendezvous last_call_timeout, seconds (torch's default)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the jobs' logs (path on stderr)")
    args = ap.parse_args()
    for name in ("cuts", "settle_steps", "work", "torch_last_call"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("recovery_deadline", "config_time_limit", "torch_gloo_timeout"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if not 0 < args.cooldown[0] <= args.cooldown[1]:
        ap.error("--cooldown: need 0 < MIN <= MAX")
    require_root("hostcut_bench")
    require_tools(args.configs, "hostcut_bench")
    with bench_workdir("hostcut-bench-", args.keep) as tmp:
        try:
            with running_hosts(3, tmp / "hosts") as hosts:
                hosts.quick_resolver()
                for config in args.configs:
                    if config == "torchrun":
                        line = torchrun_config(hosts, args, tmp)
                    else:
                        line = ours_config(config, hosts, args, tmp)
                    print(json.dumps(line), flush=True)
        except HostsError as exc:
            sys.exit(f"hostcut_bench: cannot make the test hosts: {exc}")


if __name__ == "__main__":
    main()
