"""How many CPUs this process may keep busy: its affinity, capped by its cgroup's CPU
quota.

Why the quota: a container limited to 2 CPUs on a 64-CPU machine still sees 64 CPUs in
its affinity mask. Threads that spin or overlap there would burn the quota the work
they wait for needs (the rules that use this count are in ``selection.py`` and
``shm.default_spin_us``).

The parsers are pure; ``usable_cpus`` reads ``/proc/self/cgroup`` and the quota files
of cgroup v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def quota_cpus(quota: str, period: str) -> float | None:
    """CPUs a quota of ``quota`` microseconds per ``period`` allows; None when there is
    no quota ("max", a negative value) or the text is not a quota."""
    try:
        q, p = float(quota), float(period)
    except ValueError:
        return None
    if not (math.isfinite(q) and math.isfinite(p)) or q <= 0 or p <= 0:
        return None
    return q / p


def quota_files(proc_cgroup: str) -> list[tuple[str, ...]]:
    """Where CPU quotas that bind this process may be, from the text of
    ``/proc/self/cgroup``, as paths under ``CGROUP_ROOT``: for its group and every
    ancestor (the kernel enforces the smallest quota up the tree), the v2 ``cpu.max``
    of its unified group, and the v1 quota and period files of its ``cpu`` controller
    group. The ancestors also find a container's own quota where its cgroup file
    system is mounted at its group, which then sits at the mount's root."""
    found: list[tuple[str, ...]] = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        names = [n for n in path.split("/") if n]
        if ".." in names:  # a group outside this cgroup namespace: not ours to read
            continue
        groups = [Path(*names[:depth]) for depth in range(len(names), -1, -1)]
        if controllers == "":
            found += [(str(g / "cpu.max"),) for g in groups]
        elif "cpu" in controllers.split(","):
            mount = ",".join(sorted(controllers.split(",")))
            for base in dict.fromkeys((mount, "cpu")):
                found += [
                    (str(base / g / "cpu.cfs_quota_us"), str(base / g / "cpu.cfs_period_us"))
                    for g in groups
                ]
    return found


def _read_quota(files: tuple[str, ...], root: Path) -> float | None:
    try:
        texts = [(root / f).read_text().split() for f in files]
    except OSError:
        return None
    if len(files) == 1:  # v2: "QUOTA PERIOD"
        words = texts[0]
        return quota_cpus(words[0], words[1]) if len(words) == 2 else None
    if all(len(t) == 1 for t in texts):
        return quota_cpus(texts[0][0], texts[1][0])
    return None


def usable_cpus(root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process may keep busy: those it may run on, no more than the
    smallest CPU quota of its cgroups allows (rounded up; at least one)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        return cpus
    quotas = [_read_quota(files, root) for files in quota_files(proc_cgroup)]
    limits = [q for q in quotas if q is not None]
    return max(1, min(cpus, math.ceil(min(limits)))) if limits else cpus
