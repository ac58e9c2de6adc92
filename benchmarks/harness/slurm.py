"""A real Slurm on the test hosts (``SlurmCluster``): Debian's ``slurmctld`` in the root
network namespace (in a UTS namespace of its own, named ``elctl``), one ``slurmd`` inside
each test host (``benchmarks/harness/netns.py``), every file under one folder; no
munge (``auth/none``), no accounting database. The recipe and its traps are in
``../shared/SLURM-ON-TEST-HOSTS.md``.

Clients (``sbatch``, ``srun``, ``scontrol``) find the cluster through ``SLURM_CONF``
(``env()``); sbatch exports the submitter's environment, so the tasks get it too.
Teardown is by pid (the daemons' own, and each test host's PID 1 ends what runs there).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

from benchmarks.harness.jobs import wait_until
from benchmarks.harness.netns import NetnsHost, NetnsHosts

READY_TIMEOUT = 30.0
CONTROLLER = "elctl"
URGENT = "urgent"  # the partition whose jobs preempt the default one's
PREEMPT_GRACE = 30  # seconds from a preemption's SIGTERM to its SIGKILL (Kubernetes' too)


class SlurmError(RuntimeError):
    """The cluster could not be started, or a job could not be submitted."""


class SlurmCluster:
    """Slurm over ``hosts`` (each a node named as its host), files under ``workdir``."""

    def __init__(self, hosts: NetnsHosts, nodes: list[NetnsHost], workdir: Path):
        self.hosts = hosts
        self.nodes = nodes
        self.workdir = Path(workdir)
        self.conf = self.workdir / "slurm.conf"
        self._daemons: list[subprocess.Popen] = []

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> SlurmCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "ctld" / "state").mkdir(parents=True, exist_ok=True)
        self._write_conf()
        log = open(self.workdir / "slurmctld.out", "w")  # noqa: SIM115 (the daemon's life)
        self._daemons.append(
            subprocess.Popen(
                [
                    "unshare",
                    "--uts",
                    "sh",
                    "-c",
                    f"hostname {CONTROLLER}; exec slurmctld -D -i -f {self.conf}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,
            )
        )
        for node in self.nodes:
            (self.workdir / node.name / "spool").mkdir(parents=True, exist_ok=True)
            out = open(self.workdir / f"slurmd-{node.name}.out", "w")  # noqa: SIM115
            self._daemons.append(
                node.popen(
                    ["slurmd", "-D", "-f", str(self.conf), "-N", node.name],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self.env(),
                    start_new_session=True,
                )
            )
        self._wait_idle()
        return self

    def _write_conf(self) -> None:
        d = self.workdir
        names = ",".join(n.name for n in self.nodes)
        lines = [
            "ClusterName=elnet",
            f"SlurmctldHost={CONTROLLER}({self.hosts.gateway})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/none",
            "CredType=cred/none",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={d}/jobcomp.log",
            "SelectType=select/linear",
            "MpiDefault=none",
            f"StateSaveLocation={d}/ctld/state",
            f"SlurmctldPidFile={d}/ctld/slurmctld.pid",
            f"SlurmctldLogFile={d}/ctld/slurmctld.log",
            f"SlurmdSpoolDir={d}/%n/spool",
            f"SlurmdPidFile={d}/%n/slurmd.pid",
            f"SlurmdLogFile={d}/%n/slurmd.log",
            "SlurmdParameters=config_overrides",
            "SlurmdTimeout=5",
            "MessageTimeout=2",
            "TCPTimeout=2",
            "ReturnToService=2",
            "MinJobAge=3600",
            "KillWait=10",
            *(
                f"NodeName={n.name} NodeAddr={n.address} CPUs=2 RealMemory=1000 State=UNKNOWN"
                for n in self.nodes
            ),
            # Jobs in "urgent" preempt jobs in "test" (a preemption: SIGTERM to the
            # job's tasks, SIGKILL GraceTime later, the job then CANCELLED).
            "PreemptType=preempt/partition_prio",
            "PreemptMode=CANCEL",
            f"PartitionName=test Nodes={names} Default=YES MaxTime=INFINITE State=UP "
            f"PriorityTier=1 GraceTime={PREEMPT_GRACE}",
            f"PartitionName={URGENT} Nodes={names} MaxTime=INFINITE State=UP PriorityTier=10 "
            "PreemptMode=OFF",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    def _wait_idle(self) -> None:
        wanted = {n.name for n in self.nodes}

        def all_idle() -> bool:
            if any(daemon.poll() is not None for daemon in self._daemons):
                raise SlurmError(f"a Slurm daemon exited: {self.log_tail()}")
            done = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %T"],
                capture_output=True,
                text=True,
                env=self.env(),
                timeout=10,
            )
            idle = {line.split()[0] for line in done.stdout.splitlines() if line.endswith(" idle")}
            return wanted <= idle

        wait_until(all_idle, READY_TIMEOUT, "the Slurm nodes to be idle", interval=0.2)

    def sbatch(self, script: Path, *args: str) -> str:
        """Submit ``script``; its job id."""
        done = subprocess.run(
            ["sbatch", "--parsable", *args, str(script)],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=30,
            cwd=self.workdir,
        )
        if done.returncode != 0:
            raise SlurmError(f"sbatch: {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def scancel(self, job_id: str) -> None:
        """Cancel ``job_id`` (SIGTERM to its tasks, SIGKILL ``KillWait`` later)."""
        subprocess.run(
            ["scancel", job_id], check=True, capture_output=True, env=self.env(), timeout=10
        )

    def job_state(self, job_id: str) -> str:
        done = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=10,
        )
        found = re.search(r"JobState=(\S+)", done.stdout)
        return found.group(1) if found else "UNKNOWN"

    def log_tail(self, lines: int = 15) -> str:
        text = []
        for path in sorted(self.workdir.rglob("*.log")) + sorted(self.workdir.glob("*.out")):
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                text.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(text)

    def close(self) -> None:
        for daemon in self._daemons:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.pid, signal.SIGKILL)
        for daemon in self._daemons:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(timeout=10)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
