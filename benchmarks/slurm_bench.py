"""On a real Slurm: a node cut to the survivors' next commit, and a second allocation's
sbatch to its workers training in the job; ours (join mode) beside torchrun under srun.

**Needs root** (the test hosts are namespaces: run it with sudo and the project's
Python), Debian's ``slurmctld``, ``slurmd`` and ``slurm-client``, ``etcd``, and torch for
the ``torchrun`` configuration (``scripts/test`` installs them all); it ends with a
one-line error when one is missing.

Three test hosts (``benchmarks/harness/netns.py``), A and B Slurm nodes
(``benchmarks/harness/slurm.py``: ``slurmctld`` here, a ``slurmd`` in each), C the etcd member
ours' joined nodes rendezvous on. Each allocation is ``sbatch --no-kill
--ntasks-per-node 2`` of the recipe a user writes:

* ours: ``srun --no-kill elastic-run --join --rendezvous etcd://C:2379 --job-id ID -np 4
  --min-np 2 python workloads/steps.py OUT`` (two slots per node, from Slurm's tasks;
  the node's second task has nothing to do);
* torchrun, as its docs recommend for Slurm: ``srun --no-kill --ntasks-per-node 1
  python -m torch.distributed.run --nnodes 1:2 --nproc-per-node 2 --rdzv-backend c10d
  --rdzv-endpoint A:29400 ... workloads/torch_steps.py OUT`` (the rendezvous store in
  the agent on A, which survives; gloo timeout ``--torch-gloo-timeout``, torch's c10d
  defaults otherwise, as in ``hostcut_bench.py``).

``cut`` (``--cuts`` times each, a fresh Slurm cluster and job each time): once 4 workers
train in one round (each ``--settle-steps`` commits in it), B's link is cut (no FIN, no
RST; t0 = ``time.time()`` just before). The sample: t0 until every survivor on A has
committed a step in a round (torchrun: a worker group) newer than the one B was cut in.

``grow`` (``--grows`` times each): one allocation on A trains alone (2 workers, steady);
t0 = just before the ``sbatch`` of a second allocation on B with the same job (ours: the
same ``--job-id``; torchrun: the same rendezvous id and endpoint). The sample: t0 until
every worker on B has committed a step in the job.

``drain`` (``--drains`` times each): as ``grow``, then once the 4 workers train steadily,
t0 = just before ``scancel`` of the second allocation (SIGTERM to its tasks: for ours a
drain, a handover at the next commit; torchrun's agent on B stops its workers). The
sample: t0 until every worker on A has committed a step in a newer round (group).

One JSON line per configuration and measure on stdout (nothing else):
    {"bench": "slurm", "system": "ours"|"torchrun", "measure": "cut"|"grow"|"drain",
     "definition", "median_s", "p90_s", "max_s", "samples", "settings", "load_avg"[,
     "error"]}

    sudo python -m benchmarks.slurm_bench [--cuts 5] [--grows 3] [--drains 3]
                                          [--systems ours torchrun]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness.commits import CommitLog
from benchmarks.harness.etcd_cluster import EtcdCluster
from benchmarks.harness.netns import HostsError, NetnsHost, NetnsHosts, running_hosts
from benchmarks.harness.paths import ROOT, TORCH_STEPS, WORKLOADS
from benchmarks.harness.processes import THREAD_ENV
from benchmarks.harness.slurm import SlurmCluster
from benchmarks.harness.stats import load_avg, summary
from benchmarks.harness.testhosts import reap, require_root, require_tools
from benchmarks.harness.waits import STEADY_DEADLINE, BenchTimeout, wait_for
from benchmarks.harness.workdir import bench_workdir

SYSTEMS = ("ours", "torchrun")
SLOTS = 2
RDZV_PORT = 29400
STEPS = WORKLOADS / "steps.py"
GROW_SHAPE = f"-np {SLOTS} --max-np {2 * SLOTS}"  # one node trains; a second may join

DEFINITIONS = {
    "cut": "B's link cut -> every survivor on A has committed a step in a round (torchrun: "
    "a worker group) newer than the one B was cut in",
    "grow": "sbatch of a second allocation on B -> every worker on B has committed a step "
    "in the job",
    "drain": "scancel of the second allocation (on B) -> every worker on A has committed "
    "a step in a round (torchrun: a worker group) newer than the one of both nodes",
}


class Allocations:
    """The Slurm cluster of one sample and the allocations of one system on it."""

    def __init__(self, system: str, hosts: NetnsHosts, etcd_url: str, workdir: Path, args):
        self.system, self.hosts, self.workdir, self.args = system, hosts, workdir, args
        self.a, self.b = hosts[0], hosts[1]
        self.out = workdir / "out"
        self.out.mkdir(parents=True)
        self.log = CommitLog(self.out, round_field="round" if system == "ours" else "group")
        self.etcd_url = etcd_url
        self.job_id = f"slurm-{secrets.token_hex(4)}"
        self.slurm = SlurmCluster(hosts, [self.a, self.b], workdir / "slurm").start()
        self.jobs: list[str] = []

    def script(self, name: str, shape: str) -> Path:
        if self.system == "ours":
            node = (
                f"{shlex.quote(sys.executable)} -m driver.cli --join --rendezvous "
                f"{self.etcd_url} --job-id {self.job_id} {shape} "
                f"--events {self.workdir}/events-$SLURMD_NODENAME.jsonl "
                f"{shlex.quote(sys.executable)} {STEPS} {self.out} --work {self.args.work}"
            )
            tasks = ""
        else:
            conf = ",".join(
                f"{k}={v}"
                for k, v in {
                    "join_timeout": 600,
                    "last_call_timeout": self.args.torch_last_call,
                    "close_timeout": 30,
                    "keep_alive_interval": 5,
                    "keep_alive_max_attempt": 3,
                    "read_timeout": 60,
                }.items()
            )
            node = (
                f"{shlex.quote(sys.executable)} -m torch.distributed.run --nnodes=1:2 "
                f"--nproc-per-node={SLOTS} --max-restarts=10 --rdzv-backend=c10d "
                f"--rdzv-endpoint={self.a.address}:{RDZV_PORT} --rdzv-id={self.job_id} "
                f'--rdzv-conf="is_host=$([ "$SLURMD_NODENAME" = {self.a.name} ] && echo 1 '
                f'|| echo 0),{conf}" --monitor-interval=0.1 '
                '--local-addr="$(hostname -I | cut -d" " -f1)" '
                f"{TORCH_STEPS} {self.out} --work {self.args.work} "
                f"--timeout {self.args.torch_gloo_timeout:g}"
            )
            tasks = "--ntasks-per-node 1 "
        path = self.workdir / f"{name}.sbatch"
        path.write_text(
            "#!/bin/bash\n"
            f"cd {ROOT}\n"
            f"export ELASTIC_JOB_SECRET={self.args.secret}\n"
            + "".join(f"export {k}={v}\n" for k, v in THREAD_ENV.items())
            + "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 GLOO_SOCKET_IFNAME=eth0\n"
            f"srun --no-kill {tasks}bash -c {shlex.quote(node)}\n"
        )
        return path

    def sbatch(self, name: str, nodes: list[NetnsHost], shape: str) -> str:
        """Submit allocation ``name`` on ``nodes``; ``shape``: ours' -np flags, the same
        on every allocation of a job."""
        job = self.slurm.sbatch(
            self.script(name, shape),
            *("--no-kill", "-N", str(len(nodes)), "-w", ",".join(n.name for n in nodes)),
            # ours: the node's slots are its tasks; torchrun: one agent task per node
            *("--ntasks-per-node", str(SLOTS if self.system == "ours" else 1)),
            *("--output", str(self.workdir / f"{name}.out")),
        )
        self.jobs.append(job)
        return job

    def check_running(self) -> None:
        state = self.slurm.job_state(self.jobs[0])
        if state not in ("PENDING", "RUNNING", "CONFIGURING"):
            tail = (self.workdir / "first.out").read_text(errors="replace")[-600:]
            raise BenchTimeout(f"the first allocation is {state}: {tail}")

    def steady(self, size: int) -> tuple[float, list[str]] | None:
        """(round, its workers) once the newest round has ``size`` workers, each with
        ``--settle-steps`` commits in it."""
        self.check_running()
        return self.log.steady_round(size, self.args.settle_steps)

    def wait_trained_on(self, host: NetnsHost, after_round: float, t0: float, what: str) -> float:
        """Seconds from ``t0`` until ``trained_on(host, after_round, t0)``.

        Raises:
            BenchTimeout: not within ``--recovery-deadline``.
        """
        done = wait_for(
            lambda: self.trained_on(host, after_round, t0), self.args.recovery_deadline, what
        )
        return done - t0

    def on(self, host: NetnsHost, keys: list[str]) -> list[str]:
        """The worker keys of ``host`` (ours: ids start with the node name; torchrun's
        file names carry the host name)."""
        return [k for k in keys if k.startswith(f"{host.name}-") or f"-{host.name}-" in k]

    def trained_on(self, host: NetnsHost, after_round: float, t0: float) -> float | None:
        """When the last of ``SLOTS`` workers on ``host`` first committed, after ``t0``,
        in a round (a group) newer than ``after_round``; None until they all have.
        (torchrun's restarted workers are new processes, logged under new keys.)"""
        self.check_running()
        self.log.poll()
        keys = self.on(host, list(self.log.records))
        times = [t for k in keys if (t := self.log.first_commit_after(k, after_round, t0))]
        return max(times) if len(times) >= SLOTS else None

    def close(self) -> None:
        (self.out / "stop").touch()
        for job in self.jobs:
            with contextlib.suppress(subprocess.SubprocessError):
                self.slurm.scancel(job)
        self.slurm.close()
        reap(self.a, self.b)
        self.b.restore()


def sample_cut(alloc: Allocations, args) -> float:
    alloc.sbatch("first", [alloc.a, alloc.b], f"-np {2 * SLOTS} --min-np {SLOTS}")
    round_id, _ = wait_for(lambda: alloc.steady(2 * SLOTS), STEADY_DEADLINE, "a steady round of 4")
    t0 = time.time()
    alloc.b.cut()
    return alloc.wait_trained_on(alloc.a, round_id, t0, "the survivors' commit in a newer round")


def sample_grow(alloc: Allocations, args) -> float:
    alloc.sbatch("first", [alloc.a], GROW_SHAPE)
    round_id, _ = wait_for(lambda: alloc.steady(SLOTS), STEADY_DEADLINE, "a steady round of 2")
    t0 = time.time()
    alloc.sbatch("second", [alloc.b], GROW_SHAPE)
    return alloc.wait_trained_on(alloc.b, round_id, t0, "the second allocation's commits")


def sample_drain(alloc: Allocations, args) -> float:
    sample_grow(alloc, args)
    round_id, _ = wait_for(
        lambda: alloc.steady(2 * SLOTS), STEADY_DEADLINE, "a steady round of 4 on both nodes"
    )
    t0 = time.time()
    alloc.slurm.scancel(alloc.jobs[1])
    return alloc.wait_trained_on(alloc.a, round_id, t0, "the first allocation's newer round")


def measure(
    system: str,
    name: str,
    count: int,
    sample: Callable[[Allocations, argparse.Namespace], float],
    hosts: NetnsHosts,
    etcd_url: str,
    tmp: Path,
    args,
) -> dict:
    result: dict = {
        "bench": "slurm",
        "system": system,
        "measure": name,
        "definition": DEFINITIONS[name],
        "settings": {
            "work": args.work,
            "settle_steps": args.settle_steps,
            **(
                {
                    "torch_gloo_timeout_s": args.torch_gloo_timeout,
                    "torch_last_call_s": args.torch_last_call,
                }
                if system == "torchrun"
                else {}
            ),
        },
    }
    samples: list[float] = []
    try:
        for i in range(count):
            alloc = Allocations(system, hosts, etcd_url, tmp / f"{system}-{name}-{i}", args)
            try:
                samples.append(sample(alloc, args))
            finally:
                alloc.close()
    except (BenchTimeout, RuntimeError) as exc:
        result["error"] = str(exc)
    result.update(summary(samples), load_avg=load_avg())
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuts", type=int, default=5, help="node cuts per system")
    ap.add_argument("--grows", type=int, default=3, help="second allocations per system")
    ap.add_argument("--drains", type=int, default=3, help="scancels of a second allocation")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--settle-steps", type=int, default=20)
    ap.add_argument("--work", type=int, default=160, help="matrix side each step computes")
    ap.add_argument("--recovery-deadline", type=float, default=240.0)
    ap.add_argument("--torch-gloo-timeout", type=float, default=30.0)
    ap.add_argument("--torch-last-call", type=int, default=30)
    ap.add_argument("--keep", action="store_true", help="keep the jobs' logs (path on stderr)")
    args = ap.parse_args()
    args.secret = secrets.token_hex(16)
    require_root("slurm_bench")
    require_tools(["etcd", *(["torchrun"] if "torchrun" in args.systems else [])], "slurm_bench")
    for tool in ("slurmctld", "slurmd", "sbatch"):
        if shutil.which(tool) is None:
            sys.exit(
                f"slurm_bench: {tool} not found: apt-get install slurmctld slurmd slurm-client"
            )
    os.environ.update(THREAD_ENV)
    with bench_workdir("slurm-bench-", args.keep) as tmp:
        try:
            with running_hosts(3, tmp / "hosts") as hosts:
                hosts.quick_resolver()
                etcd = EtcdCluster(1, tmp / "etcd", hosts=[hosts[2]]).start()
                try:
                    for system in args.systems:
                        for name, count, sample in (
                            ("cut", args.cuts, sample_cut),
                            ("grow", args.grows, sample_grow),
                            ("drain", args.drains, sample_drain),
                        ):
                            if count:
                                line = measure(
                                    system, name, count, sample, hosts, etcd.url, tmp, args
                                )
                                print(json.dumps(line), flush=True)
                finally:
                    etcd.stop()
        except HostsError as exc:
            sys.exit(f"slurm_bench: cannot make the test hosts: {exc}")


if __name__ == "__main__":
    main()
