"""The round protocol with per-host control, simulated to thousands of workers: one
agent per host is the store's client for its workers.

Each simulated host is an agent with its own store client and connection, one lease
(kept alive by the client's thread) and, as the product's agent, two watches: of the
round's head (``JobKeys.plan_head``) and of its host's parts
(``JobKeys.plan_host_prefix``); on each head it takes its host's part of the round
(``rendezvous.host_plan.read_view``: the part its watch delivered, written before the
head, or else read once), and every worker of the host then holds its part of the plan (a worker is told by its agent over a local channel, which costs the
store nothing: the simulation counts it as free). A worker costs the store only its
registration, written by its agent under the agent's lease. The driver is the stand-in
of ``rendezvous_scale_bench`` (the driver's watches, messages and planner) publishing
with the product's writes (``rendezvous.host_plan.plan_ops``: the whole plan once,
the head, one part per host).

A round, as in ``rendezvous_scale_bench``: a worker leaves (its agent saw its process
exit and deletes its registration), its two ring neighbours report the failure (they
saw its connection close; the others hear of it from them, which they do not report:
``elastic.worker_reports.worth_reporting``), the driver plans and publishes the next round;
then a replacement registers through the same agent and a second round takes it in.
Per (store, N), over the measured rounds:

* ``leave_ms`` / ``join_ms``: from the change (just before the registration's delete,
  or the replacement's put) to each worker holding its part: p50 and p99 over every
  (round, worker), and ``last``, the median over rounds of the last worker's time;
  ``publish_ms``: to the driver's write (median);
* ``writes_per_round`` (store revisions), ``watch_events_per_round`` (the agents' and
  the driver's), ``store_sent_bytes_per_round`` (what the store's process sent to its
  clients: the kernel's count per connection, ``rendezvous_scale_bench.store_sent_bytes``),
  ``plan_bytes`` (``all``: what one publish writes, the whole plan, the head and every
  host's part; ``whole`` and ``head`` alone);
* ``cpu_ms_per_round``: the driver's, the store's and every agent's process together.

One JSON line per (store, N) on stdout, the same keys as ``rendezvous_scale_bench`` where
they mean the same:
    {"bench": "scale_sim", "protocol": "per-host", "store", "workers", "hosts",
     "agent_processes", "rounds", "plan_bytes", "leave_ms", "join_ms", "publish_ms",
     "writes_per_round", "watch_events_per_round", "agent_events_per_round",
     "driver_events_per_round", "store_sent_bytes_per_round", "cpu_ms_per_round",
     "seconds", "load_avg"[, "error"]}

    nice -n 19 python -m benchmarks.scale_sim [--workers 64 512 4096] [--stores etcd embedded]
        [--cycles 3] [--agents-per-process 128]

Fits: ``python -m benchmarks.scale_sim --fit FILE`` reads such lines and prints, per
store, the least-squares fit of each cost against N (slope per worker, intercept, and
the largest relative error of the fit: near 0 for a cost linear in N).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from benchmarks import (
    rendezvous_scale_bench as base,  # (this folder: its driver, processes, stores)
)
from driver.job.wiring import worker_id_for
from driver.threads import spawn
from rendezvous import open_store
from rendezvous.errors import RendezvousError
from rendezvous.host_plan import LatestParts, RoundHead, plan_ops, read_view
from rendezvous.keys import JobKeys
from rendezvous.schema.rounds import Plan
from rendezvous.schema.workers import FailureRecord, WorkerInfo
from rendezvous.store import PUT, Delete, Event, KVStore, Lease, Put, Watch

#: simulated agents per process (each with its own store client, lease and watches)
AGENTS_PER_PROCESS = 128
#: how often gRPC's Python client wakes a thread blocked in a call (its own default is
#: 0.1 s, so that signal handlers run): an agent on its own host has a few calls open,
#: but a process of 128 simulated agents has hundreds, and their wake-ups alone took
#: most of its CPU. The store sees the same requests either way.
GRPC_WAKE_SECONDS = 5.0


# -------------------------------------------------------------------------- agents


class SimAgent:
    """One host's agent: the store's only client for the host's workers (see the module
    docstring). ``on_held`` is called after each round its host holds."""

    def __init__(self, host: str, keys: JobKeys, store_url: str, secret: str | None, on_held):
        self.host = host
        self._keys = keys
        self._on_held = on_held
        self._store: KVStore = open_store(store_url, secret, base.PATIENT)
        self._closed = threading.Event()
        self.events = 0
        self.failed: str | None = None
        #: worker id -> [(round id, monotonic time its agent held its part)]
        self.held: dict[str, list[tuple[int, float]]] = {}
        self.workers: set[str] = set()
        self._latest = 0
        self._lease: Lease = self._store.grant_lease(base.LEASE_TTL)
        self._lease.keep_alive(on_lost=self._lost)
        self._parts = LatestParts()
        kvs, parts_watch = self._store.read_and_watch(keys.plan_host_prefix(host))
        self._parts.reset({kv.key: kv.value for kv in kvs})
        self._parts_follower = spawn(
            f"agent-parts-{host}", self._follow, parts_watch, "parts", self._part_event
        )
        kvs, watch = self._store.read_and_watch(keys.plan_head)
        for kv in kvs:
            if kv.key == keys.plan_head:
                self._take(kv.value)
        self._follower = spawn(f"agent-{host}", self._follow, watch, "round", self._head_event)

    def _lost(self, exc: Exception) -> None:
        self.failed = f"lease lost: {exc}"

    def _follow(self, watch: Watch, what: str, on_event: Callable[[Event], None]) -> None:
        while not self._closed.is_set():
            try:
                event = watch.get(timeout=30.0)  # close() ends the watch at once
            except RendezvousError as exc:
                self.failed = f"{what} watch ended: {exc}"
                return
            if event is not None:
                self.events += 1
                on_event(event)

    def _head_event(self, event: Event) -> None:
        if event.type == PUT and event.key == self._keys.plan_head:
            self._take(event.value)

    def _part_event(self, event: Event) -> None:
        self._parts.seen(event.key, event.value if event.type == PUT else None)

    def _take(self, head_value: bytes) -> None:
        head = RoundHead.from_json(head_value)
        if head.round_id <= self._latest:
            return
        view = read_view(self._store.get, self._keys, head, self.host, self._parts.get)
        if view is None:
            return
        self._latest = head.round_id
        now = time.monotonic()
        for member in view.members:  # each told over the local channel: free
            self.held.setdefault(member.worker_id, []).append((head.round_id, now))
        self._on_held()

    def register(self, spec: base.MemberSpec) -> float:
        """Register one worker of this host under the agent's lease; the time just
        before the put."""
        address = f"10.{spec.slot}.{len(spec.host) % 256}.1:{20000 + spec.slot}"
        info = WorkerInfo(spec.member_id, spec.host, spec.slot, os.getpid(), address)
        t0 = time.monotonic()
        self._store.put(self._keys.worker(spec.member_id), info.to_json(), lease=self._lease)
        self.workers.add(spec.member_id)
        return t0

    def remove(self, member_id: str) -> float:
        """The worker's process exited: its registration goes; the time just before."""
        t0 = time.monotonic()
        self._store.delete(self._keys.worker(member_id))
        self.workers.discard(member_id)
        self.held.pop(member_id, None)
        return t0

    def report(self, round_id: int, reporter: str) -> None:
        """The failure of round ``round_id`` as worker ``reporter`` of this host saw it
        (a crash: no suspect, ``elastic.worker_reports.suspect_of``), under the agent's lease."""
        record = FailureRecord(reporter, round_id, "peer lost (simulated)").to_json()
        self._store.put(self._keys.failure(round_id, reporter), record, lease=self._lease)

    def held_since(self, member_id: str, round_id: int) -> float | None:
        return next((t for r, t in self.held.get(member_id, ()) if r >= round_id), None)

    def close(self) -> None:
        self._closed.set()
        self._lease.stop_keep_alive()
        self._store.close()
        self._follower.join(timeout=5)
        self._parts_follower.join(timeout=5)


class AgentProcess:
    """The agents of one process, and the commands the benchmark sends it."""

    def __init__(self, store_url: str, secret: str | None, job_id: str):
        self._store_url = store_url
        self._secret = secret
        self._keys = JobKeys(job_id)
        self._cond = threading.Condition()
        self.agents: dict[str, SimAgent] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(base.HOST_POOL, "sim-agents")

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _open(self, host: str, specs: Sequence[base.MemberSpec]) -> None:
        agent = SimAgent(host, self._keys, self._store_url, self._secret, self._notify)
        with self._cond:
            self.agents[host] = agent
        for spec in specs:
            agent.register(spec)

    def start(self, by_host: dict[str, list[base.MemberSpec]]) -> int:
        list(self._pool.map(lambda item: self._open(*item), by_host.items()))
        return len(by_host)

    def join(self, spec: base.MemberSpec) -> float:
        return self.agents[spec.host].register(spec)

    def leave(self, member_id: str, host: str, round_id: int) -> float | None:
        """The worker ``member_id`` of ``host`` exits, if ``host`` is here (its t0 is
        returned), and its two ring neighbours (counted on its host: the writes are the
        store's either way) report the failure. Returns once the reports are written."""
        agent = self.agents.get(host)
        if agent is None:
            return None
        written = [
            self._pool.submit(agent.report, round_id, f"{member_id}-{side}")
            for side in ("left", "right")
        ]
        t0 = agent.remove(member_id)
        for done in written:
            done.result(timeout=base.COMMAND_DEADLINE)
        return t0

    def await_round(self, round_id: int, timeout: float) -> dict[str, float]:
        """When each worker here first held round ``round_id`` or newer.

        Raises:
            TimeoutError: some did not within ``timeout``."""

        def held() -> dict[str, float | None]:
            agents = self.agents.values()
            return {w: a.held_since(w, round_id) for a in agents for w in a.workers}

        def failures() -> list[str]:
            return sorted({a.failed for a in self.agents.values() if a.failed})

        return base.wait_held(self._cond, held, failures, round_id, timeout)

    def stats(self) -> dict[str, int]:
        return {"events": sum(a.events for a in self.agents.values())}

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for agent in list(self.agents.values()):
            agent.close()


def agents_main(
    conn: multiprocessing.connection.Connection, store_url: str, secret: str | None, job_id: str
) -> None:
    if store_url.startswith("etcd"):
        import grpc._common  # the client etcd is spoken with (see GRPC_WAKE_SECONDS)

        grpc._common.MAXIMUM_WAIT_TIMEOUT = GRPC_WAKE_SECONDS
    agents = AgentProcess(store_url, secret, job_id)
    base.serve_commands(
        conn,
        {
            "start": agents.start,
            "join": agents.join,
            "leave": agents.leave,
            "await": agents.await_round,
            "stats": agents.stats,
            "stop": agents.close,
        },
    )


# -------------------------------------------------------------------------- driver


class HostPlanDriver(base.DriverStandIn):
    """The driver stand-in, publishing as the product's driver does: one transaction
    with the whole plan, its head, the parts (written before it when many) and the
    previous round's parts deleted, and the failure reports cleared."""

    def publish(self, plan: Plan) -> float:
        writes = plan_ops(self._keys, plan, self.plan)
        for batch in writes.before:
            self._store.txn([], list(batch))
        self._store.txn([], [*writes.publish, Delete(self._keys.failures, prefix=True)])
        written = time.monotonic()
        for batch in writes.after:
            self._store.txn([], list(batch))
        puts = [op for batch in writes.before for op in batch] + list(writes.publish)
        sizes = [len(op.value) for op in puts if isinstance(op, Put)]
        with self.lock:
            self.plan_bytes = {"all": sum(sizes), "whole": len(plan.to_json())}
            self.plan_bytes["head"] = len(writes.head.to_json())
        return written

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {**super().stats(), "plan_bytes": dict(getattr(self, "plan_bytes", {}))}


# ------------------------------------------------------------------------ one config


class Sim:
    """One (store, N) configuration: its processes, its rounds, its numbers."""

    def __init__(self, store: base.StoreUnderTest, args: argparse.Namespace, n: int):
        self.store = store
        self.args = args
        self.n = n
        self.keys = JobKeys(f"sim-{n}")
        host_count = math.ceil(n / base.SLOTS_PER_HOST)
        self.hosts = [(f"node{i:04d}", base.SLOTS_PER_HOST) for i in range(host_count)]
        processes = max(2, math.ceil(host_count / args.agents_per_process))
        self.rng = random.Random(args.seed)
        self.ctx = multiprocessing.get_context("spawn")
        self.children: list[base.Child] = []
        secret = store.secret
        self.driver = self._spawn(
            base.driver_main, store.url, secret, self.keys.job_id, self.hosts, n, HostPlanDriver
        )
        self.agent_children = [
            self._spawn(agents_main, store.url, secret, self.keys.job_id) for _ in range(processes)
        ]
        self.owner = {h: self.agent_children[i % processes] for i, (h, _) in enumerate(self.hosts)}
        self.place: dict[str, base.MemberSpec] = {}
        self.sequence = 0
        self.round = 0
        self.client = open_store(store.url, secret)

    def _spawn(self, target: Callable, *args: Any) -> base.Child:
        child = base.Child(self.ctx, target, *args)
        self.children.append(child)
        return child

    def new_spec(self, host: str, slot: int) -> base.MemberSpec:
        self.sequence += 1
        return base.MemberSpec(worker_id_for(host, slot, self.sequence), host, slot)

    def close(self) -> None:
        for child in self.children:
            child.stop()
        self.client.close()

    def start(self) -> None:
        per_child: dict[base.Child, dict[str, list[base.MemberSpec]]] = {
            c: {} for c in self.agent_children
        }
        for host, slots in self.hosts:
            specs = []
            for slot in range(slots):
                if len(self.place) < self.n:
                    spec = self.new_spec(host, slot)
                    self.place[spec.member_id] = spec
                    specs.append(spec)
            per_child[self.owner[host]][host] = specs
        deadline = base.round_deadline(self.n)
        for child, by_host in per_child.items():
            child.send("start", by_host)
        for child in per_child:
            child.result(deadline)
        last = sorted(self.place)[-1]
        self.round = self.driver.call("wait_round", 0, last, True, deadline, timeout=999)
        base.call_all(self.agent_children, "await", self.round, deadline, timeout=999)

    def cycle(self) -> tuple[list[float], list[float], dict[str, float]]:
        deadline = base.round_deadline(self.n)
        leaver = self.place.pop(self.rng.choice(sorted(self.place)))
        t0s = base.call_all(
            self.agent_children,
            "leave",
            leaver.member_id,
            leaver.host,
            self.round,
            timeout=base.COMMAND_DEADLINE,
        )
        t0 = next(t for t in t0s if t is not None)
        left = self.driver.call("wait_round", self.round, leaver.member_id, False, deadline)
        leave = self._held(left, t0)
        spec = self.new_spec(leaver.host, leaver.slot)
        self.place[spec.member_id] = spec
        t1 = self.owner[spec.host].call("join", spec)
        joined = self.driver.call("wait_round", left, spec.member_id, True, deadline)
        join = self._held(joined, t1)
        self.round = joined
        published = self.driver.call("stats")["published"]
        return leave, join, {"leave": published[left] - t0, "join": published[joined] - t1}

    def _held(self, round_id: int, t0: float) -> list[float]:
        answers = base.call_all(
            self.agent_children, "await", round_id, base.round_deadline(self.n), timeout=999
        )
        return [t - t0 for held in answers for t in held.values()]

    def snapshot(self) -> dict[str, Any]:
        pids = {
            "driver": [self.driver.pid],
            "store": [self.store.pid],
            "agents": [c.pid for c in self.agent_children],
        }
        return {
            "cpu": {k: sum(base.cpu_seconds(p) for p in ps) for k, ps in pids.items()},
            "driver": self.driver.call("stats"),
            "agents": sum(
                s["events"] for s in base.call_all(self.agent_children, "stats", timeout=60)
            ),
            "revision": self.client.revision(),
            "sent": base.store_sent_bytes(self.store),
        }

    def run(self) -> dict[str, Any]:
        measured = base.measure_rounds(self.start, self.cycle, self.snapshot, self.args.cycles)
        costs = base.round_costs(measured, "agents", "agent_events_per_round")
        return {
            "plan_bytes": measured.after["driver"]["plan_bytes"],
            **costs,
            "leave_ms": last_named(costs["leave_ms"]),
            "join_ms": last_named(costs["join_ms"]),
        }


def last_named(summary: dict[str, float | None]) -> dict[str, float | None]:
    """``rendezvous_scale_bench.latency_summary``, its slowest member named ``last``."""
    return {"p50": summary["p50"], "p99": summary["p99"], "last": summary["all_median"]}


def run_config(store_name: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    hosts = math.ceil(n / base.SLOTS_PER_HOST)
    line: dict[str, Any] = {
        "bench": "scale_sim",
        "protocol": "per-host",
        "store": store_name,
        "workers": n,
        "hosts": hosts,
        "agent_processes": max(2, math.ceil(hosts / args.agents_per_process)),
        "rounds": 2 * args.cycles,
    }
    try:
        with base.STORES[store_name]() as store:
            sim = Sim(store, args, n)
            try:
                line.update(sim.run())
            finally:
                sim.close()
    except (RuntimeError, RendezvousError, TimeoutError, OSError) as exc:
        line["error"] = str(exc).splitlines()[0]
        print(f"{store_name} N={n}: {exc}", file=sys.stderr)
    line["load_avg"] = round(os.getloadavg()[0], 2)
    return line


# ------------------------------------------------------------------------------ fits

#: the costs fitted against N, each a path into a line
FITTED = {
    "store_sent_bytes_per_round": ("store_sent_bytes_per_round",),
    "plan_bytes": ("plan_bytes", "all"),
    "cpu_store_ms": ("cpu_ms_per_round", "store"),
    "cpu_driver_ms": ("cpu_ms_per_round", "driver"),
    "writes_per_round": ("writes_per_round",),
    "watch_events_per_round": ("watch_events_per_round",),
}


def linear_fit(points: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Least squares ``y = slope * n + intercept`` over ``points`` (n, y), the largest
    error of the fit relative to y, and ``power``: the least-squares slope of log y
    against log n (a cost linear in N has a power near 1, one growing as N x N near 2;
    the relative error of a line is large where a fixed cost weighs on the small N)."""
    ns, ys = [p[0] for p in points], [p[1] for p in points]
    mean_n, mean_y = statistics.fmean(ns), statistics.fmean(ys)
    var = sum((n - mean_n) ** 2 for n in ns)
    slope = sum((n - mean_n) * (y - mean_y) for n, y in points) / var if var else 0.0
    intercept = mean_y - slope * mean_n
    worst = max(abs(slope * n + intercept - y) / abs(y) for n, y in points if y)
    logs = [(math.log(n), math.log(y)) for n, y in points if n > 0 and y > 0]
    power = float("nan")
    if len(logs) >= 2:
        mean_x, mean_ly = statistics.fmean(x for x, _ in logs), statistics.fmean(y for _, y in logs)
        var_x = sum((x - mean_x) ** 2 for x, _ in logs)
        if var_x:
            power = sum((x - mean_x) * (y - mean_ly) for x, y in logs) / var_x
    return {
        "slope": round(slope, 3),
        "intercept": round(intercept, 1),
        "max_rel_err": round(worst, 3),
        "power": round(power, 2),
    }


def fits(lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for store in sorted({line["store"] for line in lines}):
        ok = [x for x in lines if x["store"] == store and "error" not in x]
        if len(ok) < 2:
            continue
        for name, path in FITTED.items():
            points = []
            for x in ok:
                value: Any = x
                for part in path:
                    value = value[part]
                points.append((float(x["workers"]), float(value)))
            fit = linear_fit(points)
            out.append({"fit": name, "store": store, "against": "workers", **fit})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[64, 512, 4096])
    parser.add_argument("--stores", nargs="+", choices=sorted(base.STORES), default=["etcd"])
    parser.add_argument("--cycles", type=int, default=3, help="leave+join cycles measured")
    parser.add_argument("--agents-per-process", type=int, default=AGENTS_PER_PROCESS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fit", type=Path, help="print the fits of the JSON lines in FILE")
    args = parser.parse_args()
    if args.fit is not None:
        lines = [json.loads(x) for x in args.fit.read_text().splitlines() if x.startswith("{")]
        for fit in fits([x for x in lines if x.get("bench") == "scale_sim"]):
            print(json.dumps(fit))
        return
    if args.cycles < 1 or any(n < 2 for n in args.workers):
        parser.error("--cycles must be >= 1 and every --workers >= 2")
    base.raise_fd_limit()
    for n in args.workers:
        for store_name in args.stores:
            print(json.dumps(run_config(store_name, n, args)), flush=True)


if __name__ == "__main__":
    main()
