"""The round protocol at scale, simulated: N workers against the embedded store and etcd.

A round is what happens in a job whose worker leaves, without training: the worker's
registration lease is revoked (the membership change), every survivor reports the
failure (a ring's abort reaches each of them), the driver sees the registration go,
plans the next round and publishes it, and every worker receives the plan through its
watch of the round key. Then a replacement registers in the freed slot and a second
round takes it in. Measured per (store, N):

* ``leave_ms`` / ``join_ms``: from the change (t0 just before the lease revoke, or the
  replacement's registration put) to each worker holding the new plan (its watch
  delivered it and it parsed it): p50 and p99 over every (round, worker), and
  ``all_median``, the median over rounds of the time until the last worker held it.
  ``publish_ms``: t0 to the driver's put of the plan (median). Times are
  ``time.monotonic()``, one clock for every process on the machine.
* ``writes_per_round``: store revisions (one per write that changed something);
  ``watch_events_per_round``: events delivered to the workers' and the driver's
  watches (``worker_events_per_round`` and ``driver_events_per_round`` split it);
  ``driver_turns_per_round``: the driver's turns of its rules (one per burst of
  messages that changes something).
* ``store_sent_bytes_per_round``: bytes the store's process sent to its clients
  (``store_sent_bytes``).
* ``cpu_ms_per_round``: CPU of the driver process, the store's process (the embedded
  server run alone, ``python -m rendezvous.server``, or etcd) and every simulated
  worker together (``workers``), from ``/proc`` over the measured rounds.

Real: the store servers, every worker's own store client and connection (its lease
kept alive by the client's thread, its watch of the round key with a follower thread
as ``elastic.runtime`` has), the driver's watches (``rendezvous.watch.follow_prefix``), its
messages, its planner and the records. Simulated: training and the data plane (a
worker's address is a label; failure reports are written when the benchmark says so);
worker processes (workers are threads of a few host processes,
``--members-per-process`` each, never a process per worker); the driver
(``DriverStandIn``: what ``driver.job.loop`` does per round and nothing else). Every process
shares the machine's cores, so at large N the workers' own work (each decodes an O(N)
plan) is part of the latency.

One JSON line per (store, N) on stdout:
    {"bench": "rendezvous_scale", "store", "workers", "hosts", "host_processes",
     "rounds", "plan_bytes", "leave_ms", "join_ms", "publish_ms", "writes_per_round",
     "watch_events_per_round", "worker_events_per_round", "driver_events_per_round",
     "driver_turns_per_round", "store_sent_bytes_per_round", "cpu_ms_per_round", "seconds",
     "load_avg"[, "error"]}

    nice -n 19 python -m benchmarks.rendezvous_scale_bench [--workers 16 64 256 1024]
        [--stores embedded etcd] [--cycles 5]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import queue
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from benchmarks.harness import stores
from benchmarks.harness.etcd_cluster import EtcdCluster
from driver.hosts.slots import HostSlots
from driver.job.messages import (
    FailureReport,
    FailureResync,
    Message,
    RegistryChanged,
    RegistryResync,
    changes_nothing,
    read_through_accusations,
)
from driver.job.wiring import worker_id_for
from driver.policy import planner
from driver.policy.decisions import Book
from driver.policy.suspicion import failure_reported
from driver.threads import spawn
from rendezvous import open_store
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.net.auth import make_secret
from rendezvous.schema.rounds import Plan
from rendezvous.schema.workers import FailureRecord, WorkerInfo
from rendezvous.store import PUT, KVStore, Lease, StoreSettings, Watch
from rendezvous.watch import follow_prefix

#: a member's registration lease. A worker's is 10 s (``WorkerSettings.lease_ttl``), but
#: hundreds of simulated workers share a process on two cores, niced: a keep-alive
#: thread can starve that long, and a lease lost to that is the simulation's, not the
#: protocol's (the rounds measured revoke leases; none expires)
LEASE_TTL = 60
#: seconds a command to a process may take before the benchmark gives up on it; waits
#: for a whole round grow with N (every member decodes an O(N) plan on shared cores)
COMMAND_DEADLINE = 120.0
#: threads per host process that start members and write their failure reports (the
#: members of a real job report at once, each from its own process)
HOST_POOL = 8
#: the workers' and the driver's store settings: at 1024 workers on two shared cores a
#: first contact can take longer than the defaults allow
PATIENT = StoreSettings(request_timeout=30.0, retry_deadline=120.0, connect_timeout=60.0)
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: worker slots of each simulated host
SLOTS_PER_HOST = 8


def round_deadline(n: int) -> float:
    return 60.0 + 0.1 * n


# ------------------------------------------------------------------------- members


@dataclass(frozen=True)
class MemberSpec:
    """One simulated member: its id and its place."""

    member_id: str
    host: str
    slot: int


class SimMember:
    """One worker speaking the store protocol as ``elastic.runtime`` does, with a client
    of its own: it watches the round key (read, then every change, with a follower
    thread), registers its ``WorkerInfo`` under a lease kept alive by the client,
    reports failures under that lease, and leaves by revoking it. ``on_plan`` is called
    after each plan that includes it."""

    def __init__(
        self,
        spec: MemberSpec,
        keys: JobKeys,
        store_url: str,
        secret: str | None,
        on_plan: Callable[[], None],
    ):
        self.spec = spec
        self._keys = keys
        self._on_plan = on_plan
        self._store: KVStore = open_store(store_url, secret, PATIENT)
        self._lease: Lease | None = None
        self._closed = threading.Event()
        self.events = 0
        self.held: list[tuple[int, float]] = []  # (round id, monotonic time it was held)
        self.failed: str | None = None
        self._latest = 0
        kvs, self._watch = self._store.read_and_watch(keys.round)
        for kv in kvs:
            if kv.key == keys.round:
                self._note(kv.value)
        self._follower = spawn(f"follow-{spec.member_id}", self._follow, self._watch)

    def _follow(self, watch: Watch) -> None:
        while not self._closed.is_set():
            try:
                # (long: close() ends the watch, which wakes this at once)
                event = watch.get(timeout=30.0)
            except RendezvousError as exc:
                self.failed = f"round watch ended: {exc}"
                return
            if event is None:
                continue
            self.events += 1
            if event.type == PUT and event.key == self._keys.round:
                self._note(event.value)

    def _note(self, value: bytes) -> None:
        plan = Plan.from_json(value)
        if plan.round_id > self._latest and plan.member(self.spec.member_id) is not None:
            self._latest = plan.round_id
            self.held.append((plan.round_id, time.monotonic()))
            self._on_plan()

    def register(self) -> float:
        """Write the registration under a new lease and keep it alive; returns the
        time just before the put (the change the driver will see)."""
        lease = self._store.grant_lease(LEASE_TTL)
        t0 = time.monotonic()
        spec = self.spec
        # A data-plane address of the usual length; nothing listens there.
        address = f"10.{spec.slot}.{len(spec.host) % 256}.1:{20000 + spec.slot}"
        info = WorkerInfo(spec.member_id, spec.host, spec.slot, os.getpid(), address)
        self._store.put(self._keys.worker(spec.member_id), info.to_json(), lease=lease)
        lease.keep_alive(on_lost=self._lost)
        self._lease = lease
        return t0

    def _lost(self, exc: Exception) -> None:
        self.failed = f"lease lost: {exc}"

    def report_failure(self, round_id: int) -> None:
        """What ``elastic.runtime.report_failure`` writes when a collective failed
        because a member crashed (no suspect: ``elastic.worker_reports.suspect_of``)."""
        record = {
            "worker_id": self.spec.member_id,
            "round_id": round_id,
            "reason": "peer lost: connection reset (simulated)",
            "suspect": None,
        }
        self._store.put(
            self._keys.failure(round_id, self.spec.member_id),
            json.dumps(record).encode(),
            lease=self._lease or 0,
        )

    def held_since(self, round_id: int) -> float | None:
        """When this member first held a plan of ``round_id`` or newer."""
        return next((t for r, t in self.held if r >= round_id), None)

    def leave(self) -> float:
        """Revoke the lease (the registration vanishes at once); returns the time just
        before the revoke."""
        lease = self._lease
        if lease is None:
            raise RuntimeError(f"{self.spec.member_id} never registered")
        lease.stop_keep_alive()
        t0 = time.monotonic()
        lease.revoke()
        self.close()
        return t0

    def close(self) -> None:
        self._closed.set()
        if self._lease is not None:
            self._lease.stop_keep_alive()
        self._store.close()
        self._follower.join(timeout=5)


class SimHost:
    """The members of one host process, and the commands the benchmark sends it."""

    def __init__(self, store_url: str, secret: str | None, job_id: str):
        self._store_url = store_url
        self._secret = secret
        self._keys = JobKeys(job_id)
        self._cond = threading.Condition()
        self.members: dict[str, SimMember] = {}
        self._gone_events = 0  # events of members that left
        self._pool = concurrent.futures.ThreadPoolExecutor(HOST_POOL, "sim-host")

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _open(self, spec: MemberSpec) -> SimMember:
        member = SimMember(spec, self._keys, self._store_url, self._secret, self._notify)
        with self._cond:
            self.members[spec.member_id] = member
        return member

    def start(self, specs: Sequence[MemberSpec]) -> int:
        """Open and register every member of ``specs`` (a few at a time)."""
        for member in self._pool.map(self._open, specs):
            member.register()
        return len(specs)

    def join(self, spec: MemberSpec) -> float:
        """A replacement: watch first, then register (as a worker does); the time of the put."""
        return self._open(spec).register()

    def leave(self, member_id: str, round_id: int) -> float | None:
        """The member ``member_id``, if it is here, leaves (its t0 is returned); every
        other member here reports the failure of ``round_id`` at the same time. Returns
        once the reports are written.

        Raises:
            RendezvousError: a report could not be written."""
        with self._cond:
            leaving = self.members.pop(member_id, None)
            others = list(self.members.values())
        written = [self._pool.submit(m.report_failure, round_id) for m in others]
        t0 = None
        if leaving is not None:
            t0 = leaving.leave()
            self._gone_events += leaving.events
        for done in written:
            done.result(timeout=COMMAND_DEADLINE)
        return t0

    def await_round(self, round_id: int, timeout: float) -> dict[str, float]:
        """When each member here first held round ``round_id`` (or newer).

        Raises:
            TimeoutError: some member did not within ``timeout`` (names them)."""

        def held() -> dict[str, float | None]:
            return {i: m.held_since(round_id) for i, m in self.members.items()}

        def failures() -> list[str]:
            return sorted({m.failed for m in self.members.values() if m.failed})

        return wait_held(self._cond, held, failures, round_id, timeout)

    def stats(self) -> dict[str, int]:
        with self._cond:
            members = list(self.members.values())
        return {"events": self._gone_events + sum(m.events for m in members)}

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for member in list(self.members.values()):
            member.close()


def wait_held(
    cond: threading.Condition,
    held: Callable[[], dict[str, float | None]],
    failures: Callable[[], list[str]],
    round_id: int,
    timeout: float,
) -> dict[str, float]:
    """Wait on ``cond`` until ``held()`` (each worker's time it held round ``round_id``,
    None: not yet; read under ``cond``) has a time for every worker; those times.

    Raises:
        TimeoutError: some did not within ``timeout`` (names them, with ``failures()``)."""
    deadline = time.monotonic() + timeout
    with cond:
        while True:
            times = held()
            missing = [i for i, t in times.items() if t is None]
            if not missing:
                return {i: t for i, t in times.items() if t is not None}
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"{len(missing)} workers never held round {round_id} "
                    f"(e.g. {missing[:3]}; failures: {failures()[:3]})"
                )
            cond.wait(min(remaining, 1.0))


def serve_commands(conn: multiprocessing.connection.Connection, handlers: dict) -> None:
    """Answer ``(command, *args)`` messages with ``("ok", result)`` or ``("error", text)``
    until ``stop`` (answered too) or until the benchmark goes away."""
    while True:
        if not conn.poll(COMMAND_DEADLINE * 10):
            return  # the benchmark is gone or stuck: do not outlive it
        try:
            command, *args = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", handlers[command](*args)))
        except Exception as exc:  # noqa: BLE001  (sent back to the benchmark, which raises)
            conn.send(("error", f"{command}: {exc!r}\n{traceback.format_exc(limit=3)}"))
        if command == "stop":
            return


def host_main(
    conn: multiprocessing.connection.Connection,
    store_url: str,
    secret: str | None,
    job_id: str,
) -> None:
    host = SimHost(store_url, secret, job_id)
    serve_commands(
        conn,
        {
            "start": host.start,
            "join": host.join,
            "leave": host.leave,
            "await": host.await_round,
            "stats": host.stats,
            "stop": host.close,
        },
    )


# -------------------------------------------------------------------------- driver


class DriverStandIn:
    """What the driver does per round, from the driver's own parts: it follows the
    registrations and the failure reports (``rendezvous.watch.follow_prefix``: a read, then
    every change; a fresh read if the watch is lost) as ``driver.job.messages`` on a queue,
    wakes once per burst of messages, reads each report, plans with
    ``driver.policy.planner.next_plan`` after every burst that changes something (as
    ``driver.job.loop`` runs its rules: ``driver.job.messages.changes_nothing``, and a
    failure report only when it changes the accusations), and publishes
    a new plan the way ``driver.job.loop`` does: the round key, then the failure reports
    cleared. The first round waits for ``np``."""

    def __init__(self, store: KVStore, keys: JobKeys, hosts: Sequence[HostSlots], np: int):
        self._store = store
        self._keys = keys
        self._hosts = tuple(hosts)
        self._np = np
        self._queue: queue.Queue[Message] = queue.Queue()
        self._registered: dict[str, tuple[int, WorkerInfo]] = {}  # by id: (create rev, info)
        self.plan: Plan | None = None
        self.lock = threading.Condition()
        self.events = 0
        self.turns = 0
        self.published: dict[int, float] = {}  # round id -> monotonic time of the put
        self._book = Book.start(time.monotonic())  # the rules' accusations (``_accuse``)

    def follow(self, stop: threading.Event) -> None:
        feeds = (
            (self._keys.workers, RegistryChanged, RegistryResync),
            (self._keys.failures, FailureReport.from_event, FailureResync),
        )
        for prefix, on_event, on_resync in feeds:
            spawn(
                f"watch-{prefix}",
                follow_prefix,
                self._store,
                prefix,
                None,
                on_event=lambda e, m=on_event: self._post(m(e)),
                on_resync=lambda kvs, m=on_resync: self._post(m(list(kvs))),
                on_lost=lambda exc: self._post(FailureResync([])),
                stop=stop,
                patience=60.0,
            )

    def _post(self, message: Message) -> None:
        with self.lock:
            self.events += 1
        self._queue.put(message)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                message = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            burst = [message]
            while True:  # one decision per burst, as driver.job.loop's turn drains its queue
                try:
                    burst.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            # no decision for a burst that changes nothing (as driver.job.loop's rules)
            changed = False
            for m in burst:
                changed |= self._handle(m)
            with self.lock:
                self.turns += changed
            if changed:
                self._decide()

    def _handle(self, message: Message) -> bool:
        """Take ``message``; whether the rules must run for it (``driver.job.loop``)."""
        quiet = changes_nothing(message, self.plan)
        if isinstance(message, FailureReport) and read_through_accusations(message):
            assert message.record is not None  # (read_through_accusations says so)
            return self._accuse(message.record)
        prefix = self._keys.workers
        if isinstance(message, RegistryChanged):
            worker_id = message.event.key[len(prefix) :]
            if message.event.type == PUT:
                kv = message.event.kv
                self._registered[worker_id] = (kv.create_revision, WorkerInfo.from_json(kv.value))
            else:
                self._registered.pop(worker_id, None)
        elif isinstance(message, RegistryResync):
            self._registered = {
                kv.key[len(prefix) :]: (kv.create_revision, WorkerInfo.from_json(kv.value))
                for kv in message.kvs
            }
        return not quiet

    def _accuse(self, report: FailureRecord) -> bool:
        """The report taken as ``driver.policy.suspicion.failure_reported`` takes it;
        whether the accusations changed. (No worker records: the reports here name no
        suspect, as a crash's.)"""
        book = failure_reported({}, self.plan, self._book, report, time.monotonic()).book
        changed, self._book = book.failures.accused != self._book.failures.accused, book
        return changed

    def _decide(self) -> None:
        live = [info for _, info in sorted(self._registered.values(), key=lambda r: r[0])]
        min_np = self._np if self.plan is None else 1
        candidate = planner.next_plan(self.plan, live, self._hosts, min_np, None)
        if candidate is None or not planner.needs_new_round(self.plan, candidate):
            return
        written = self.publish(candidate)
        with self.lock:
            self.published[candidate.round_id] = written
            self.plan = candidate
            self._book = self._book.new_round()
            self.lock.notify_all()

    def publish(self, plan: Plan) -> float:
        """The whole plan under the round key, every worker's watch (the protocol this
        benchmark measures), then the failure reports cleared; the time of the plan's
        write (a watch may deliver it before this returns)."""
        self._store.put(self._keys.round, plan.to_json())
        written = time.monotonic()
        self._store.delete_prefix(self._keys.failures)
        return written

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"events": self.events, "turns": self.turns, "published": dict(self.published)}

    def wait_round(self, after: int, worker_id: str, present: bool, timeout: float) -> int:
        """The first round after ``after`` that has (``present``) or lacks ``worker_id``,
        once published (for a benchmark that does not read the whole plan itself).

        Raises:
            TimeoutError: none within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                plan = self.plan
                newer = plan is not None and plan.round_id > after
                if newer and plan and (plan.member(worker_id) is not None) == present:
                    return plan.round_id
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no round after {after} with {worker_id} {present}")
                self.lock.wait(remaining)


def driver_main(
    conn: multiprocessing.connection.Connection,
    store_url: str,
    secret: str | None,
    job_id: str,
    hosts: list[tuple[str, int]],
    np: int,
    stand_in_class: type[DriverStandIn] = DriverStandIn,
) -> None:
    store = open_store(store_url, secret, PATIENT)
    stop = threading.Event()
    stand_in = stand_in_class(store, JobKeys(job_id), [HostSlots(h, s) for h, s in hosts], np)
    stand_in.follow(stop)
    handlers = {"stats": stand_in.stats, "wait_round": stand_in.wait_round, "stop": stop.set}
    spawn("driver-commands", serve_commands, conn, handlers)
    stand_in.run(stop)
    store.close()


# ----------------------------------------------------------------------- processes


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` (every thread), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Child:
    """A spawned process of the benchmark that answers commands (``serve_commands``)."""

    def __init__(self, ctx, target: Callable, *args: Any):
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(theirs, *args), daemon=True)
        self.process.start()
        theirs.close()

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def send(self, command: str, *args: Any) -> None:
        self.conn.send((command, *args))

    def result(self, timeout: float = COMMAND_DEADLINE) -> Any:
        """The answer to the last command sent.

        Raises:
            RuntimeError: the process answered with an error, or not within ``timeout``."""
        if not self.conn.poll(timeout):
            raise RuntimeError(f"process {self.pid} did not answer within {timeout:.0f}s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"process {self.pid}: {value}")
        return value

    def call(self, command: str, *args: Any, timeout: float = COMMAND_DEADLINE) -> Any:
        self.send(command, *args)
        return self.result(timeout)

    def stop(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(RuntimeError, OSError):
                self.call("stop", timeout=30)
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10)


def call_all(children: Sequence[Child], command: str, *args: Any, timeout: float) -> list:
    for child in children:
        child.send(command, *args)
    return [child.result(timeout) for child in children]


# ---------------------------------------------------------------------------- stores


@dataclass(frozen=True)
class StoreUnderTest:
    name: str
    url: str
    secret: str | None
    pid: int


@contextlib.contextmanager
def embedded_store() -> Iterator[StoreUnderTest]:
    """The embedded store alone in a process (``python -m rendezvous.server``)."""
    with stores.embedded_store() as (address, secret, pid):
        yield StoreUnderTest("embedded", address, secret, pid)


@contextlib.contextmanager
def etcd_store() -> Iterator[StoreUnderTest]:
    """One etcd member on free loopback ports."""
    with tempfile.TemporaryDirectory() as tmp, EtcdCluster(1, Path(tmp)) as cluster:
        proc = cluster.procs[0]
        assert proc is not None
        yield StoreUnderTest("etcd", cluster.url, None, proc.pid)


@contextlib.contextmanager
def signed_etcd_store() -> Iterator[StoreUnderTest]:
    """One etcd member, its clients given a job secret: every record written is signed
    and every record read is checked (``rendezvous.signing``), as in a real job, so
    that beside ``etcd`` it says what signing costs."""
    with etcd_store() as plain:
        yield StoreUnderTest("etcd-signed", plain.url, make_secret(), plain.pid)


STORES = {"embedded": embedded_store, "etcd": etcd_store, "etcd-signed": signed_etcd_store}


def store_sent_bytes(store: StoreUnderTest) -> int:
    """Bytes the store's process has sent to its clients so far, over the connections
    open now (the kernel's count for each TCP connection from the store's port, ``ss``;
    the clients keep theirs for the whole run)."""
    port = store.url.rsplit(":", 1)[1]
    out = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum(int(m) for m in re.findall(r"bytes_sent:(\d+)", out))


# ------------------------------------------------------------------------- one config


@dataclass
class Observer:
    """The benchmark's own watch of the round key: keeps the newest plan."""

    store: KVStore
    keys: JobKeys
    plan: Plan | None = None
    plan_bytes: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)

    def start(self, stop: threading.Event) -> None:
        watch = self.store.watch_prefix(self.keys.round)
        spawn("observer", self._run, watch, stop)

    def _run(self, watch: Watch, stop: threading.Event) -> None:
        with watch:
            while not stop.is_set():
                event = watch.get(timeout=0.5)
                if event is None:
                    continue
                with self.cond:
                    if event.type == PUT and event.key == self.keys.round:
                        self.plan = Plan.from_json(event.value)
                        self.plan_bytes = len(event.value)
                    self.cond.notify_all()

    def wait_plan(self, predicate: Callable[[Plan], bool], timeout: float, what: str) -> Plan:
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.plan is None or not predicate(self.plan):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError(f"no plan with {what} within {timeout:.0f}s")
                self.cond.wait(remaining)
            return self.plan


def quantile(xs: Sequence[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_summary(rounds: list[list[float]]) -> dict[str, float | None]:
    """p50/p99 over every (round, member) latency, and the median over rounds of the
    slowest member's (milliseconds)."""
    pooled = [x for r in rounds for x in r]
    return {
        "p50": round(quantile(pooled, 0.5) * 1e3, 1),
        "p99": round(quantile(pooled, 0.99) * 1e3, 1),
        "all_median": round(statistics.median(max(r) for r in rounds) * 1e3, 1),
    }


class Bench:
    """One (store, N) configuration: its processes, its rounds, its numbers."""

    def __init__(self, store: StoreUnderTest, args: argparse.Namespace, n: int):
        self.store = store
        self.args = args
        self.n = n
        self.keys = JobKeys(f"scale-{n}")
        host_count = math.ceil(n / SLOTS_PER_HOST)
        self.hosts = [(f"node{i:04d}", SLOTS_PER_HOST) for i in range(host_count)]
        processes = max(2, math.ceil(n / args.members_per_process))
        self.rng = random.Random(args.seed)
        self.ctx = multiprocessing.get_context("spawn")
        self.children: list[Child] = []
        self.hosts_of: dict[str, Child] = {}  # host name -> its process
        self.place: dict[str, MemberSpec] = {}  # the members now, by id
        self.sequence = 0
        self.stop = threading.Event()
        secret = store.secret
        self.driver = self._spawn(driver_main, store.url, secret, self.keys.job_id, self.hosts, n)
        self.host_children = [
            self._spawn(host_main, store.url, secret, self.keys.job_id) for _ in range(processes)
        ]
        for i, (host, _) in enumerate(self.hosts):
            self.hosts_of[host] = self.host_children[i % processes]
        self.client = open_store(store.url, secret)
        self.observer = Observer(self.client, self.keys)
        self.observer.start(self.stop)

    def _spawn(self, target: Callable, *args: Any) -> Child:
        child = Child(self.ctx, target, *args)
        self.children.append(child)
        return child

    def new_spec(self, host: str, slot: int) -> MemberSpec:
        self.sequence += 1
        return MemberSpec(worker_id_for(host, slot, self.sequence), host, slot)

    def close(self) -> None:
        self.stop.set()
        for child in self.children:
            child.stop()
        self.client.close()

    # ---- phases ----
    def start_members(self) -> None:
        per_child: dict[Child, list[MemberSpec]] = {c: [] for c in self.host_children}
        for host, slots in self.hosts:
            for slot in range(slots):
                if len(self.place) == self.n:
                    break
                spec = self.new_spec(host, slot)
                self.place[spec.member_id] = spec
                per_child[self.hosts_of[host]].append(spec)
        for child, specs in per_child.items():
            child.send("start", specs)
        for child in per_child:
            child.result(round_deadline(self.n))
        plan = self.observer.wait_plan(
            lambda p: p.size == self.n, round_deadline(self.n), f"{self.n} members"
        )
        call_all(self.host_children, "await", plan.round_id, round_deadline(self.n), timeout=999)

    def cycle(self) -> tuple[list[float], list[float], dict[str, float]]:
        """One member leaves, then its replacement joins: each member's latency for both
        rounds, and t0 to the driver's put of each plan."""
        plan = self.observer.plan
        assert plan is not None
        leaver = self.place.pop(self.rng.choice(plan.worker_ids))
        owner = self.hosts_of[leaver.host]
        t0s = call_all(
            self.host_children, "leave", leaver.member_id, plan.round_id, timeout=COMMAND_DEADLINE
        )
        t0 = next(t for t in t0s if t is not None)
        left = self.observer.wait_plan(
            lambda p: p.member(leaver.member_id) is None,
            round_deadline(self.n),
            f"{leaver.member_id} gone",
        )
        leave = self._held(left.round_id, t0)
        spec = self.new_spec(leaver.host, leaver.slot)
        self.place[spec.member_id] = spec
        t1 = owner.call("join", spec)
        joined = self.observer.wait_plan(
            lambda p: p.member(spec.member_id) is not None,
            round_deadline(self.n),
            f"{spec.member_id} in",
        )
        join = self._held(joined.round_id, t1)
        published = self.driver.call("stats")["published"]
        return (
            leave,
            join,
            {
                "leave": published[left.round_id] - t0,
                "join": published[joined.round_id] - t1,
            },
        )

    def _held(self, round_id: int, t0: float) -> list[float]:
        answers = call_all(
            self.host_children, "await", round_id, round_deadline(self.n), timeout=999
        )
        return [t - t0 for held in answers for t in held.values()]

    def snapshot(self) -> dict[str, Any]:
        pids = {
            "driver": [self.driver.pid],
            "store": [self.store.pid],
            "workers": [c.pid for c in self.host_children],
        }
        return {
            "t": time.monotonic(),
            "cpu": {k: sum(cpu_seconds(p) for p in ps) for k, ps in pids.items()},
            "driver": self.driver.call("stats"),
            "members": sum(s["events"] for s in call_all(self.host_children, "stats", timeout=60)),
            "revision": self.client.revision(),
            "sent": store_sent_bytes(self.store),
        }

    def run(self) -> dict[str, Any]:
        measured = measure_rounds(self.start_members, self.cycle, self.snapshot, self.args.cycles)
        return {
            "plan_bytes": self.observer.plan_bytes,
            **round_costs(measured, "members", "worker_events_per_round"),
            "driver_turns_per_round": measured.per_round(lambda s: s["driver"]["turns"]),
        }


@dataclass
class Measured:
    """What ``measure_rounds`` saw: the snapshots around the measured rounds, each
    member's latencies per round, and the driver's publish times."""

    before: dict[str, Any]
    after: dict[str, Any]
    rounds: int
    leaves: list[list[float]]
    joins: list[list[float]]
    publishes: list[float]
    seconds: float

    def per_round(self, get: Callable[[dict], float]) -> float:
        return round((get(self.after) - get(self.before)) / self.rounds, 1)


Cycle = Callable[[], tuple[list[float], list[float], dict[str, float]]]


def measure_rounds(
    start: Callable[[], None], cycle: Cycle, snapshot: Callable[[], dict], cycles: int
) -> Measured:
    """Start, one warm-up cycle (every code path once), then ``cycles`` measured
    leave+join cycles between two snapshots."""
    started = time.monotonic()
    start()
    cycle()
    before = snapshot()
    leaves, joins, publishes = [], [], []
    for _ in range(cycles):
        leave, join, published = cycle()
        leaves.append(leave)
        joins.append(join)
        publishes += [published["leave"], published["join"]]
    after = snapshot()
    seconds = round(time.monotonic() - started, 1)
    return Measured(before, after, 2 * cycles, leaves, joins, publishes, seconds)


def round_costs(m: Measured, clients: str, clients_name: str) -> dict[str, Any]:
    """The costs per round both benchmarks report; ``clients``: the snapshots' count
    of the store clients' watch events, reported as ``clients_name``."""
    driver_events = m.per_round(lambda s: s["driver"]["events"])
    client_events = m.per_round(lambda s: s[clients])
    return {
        "leave_ms": latency_summary(m.leaves),
        "join_ms": latency_summary(m.joins),
        "publish_ms": round(statistics.median(m.publishes) * 1e3, 1),
        "writes_per_round": m.per_round(lambda s: s["revision"]),
        "watch_events_per_round": round(driver_events + client_events, 1),
        clients_name: client_events,
        "driver_events_per_round": driver_events,
        "store_sent_bytes_per_round": round(m.per_round(lambda s: s["sent"])),
        "cpu_ms_per_round": {
            k: round((m.after["cpu"][k] - m.before["cpu"][k]) * 1e3 / m.rounds, 1)
            for k in m.after["cpu"]
        },
        "seconds": m.seconds,
    }


def run_config(store_name: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    line: dict[str, Any] = {
        "bench": "rendezvous_scale",
        "store": store_name,
        "workers": n,
        "hosts": math.ceil(n / SLOTS_PER_HOST),
        "host_processes": max(2, math.ceil(n / args.members_per_process)),
        "rounds": 2 * args.cycles,
    }
    try:
        with STORES[store_name]() as store:
            bench = Bench(store, args, n)
            try:
                line.update(bench.run())
            finally:
                bench.close()
    except (RuntimeError, RendezvousError, TimeoutError, OSError) as exc:
        line["error"] = str(exc).splitlines()[0]
        print(f"{store_name} N={n}: {exc}", file=sys.stderr)
    line["load_avg"] = round(os.getloadavg()[0], 2)
    return line


def raise_fd_limit() -> None:
    """Thousands of members mean thousands of sockets: take the hard limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--stores", nargs="+", choices=sorted(STORES), default=list(STORES))
    parser.add_argument("--cycles", type=int, default=5, help="leave+join cycles measured")
    # More workers in one process starve some of their threads of the GIL (a lease
    # keep-alive for over a minute at 256 per process).
    parser.add_argument("--members-per-process", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.cycles < 1 or any(n < 2 for n in args.workers):
        parser.error("--cycles must be >= 1 and every --workers >= 2")
    raise_fd_limit()
    for n in args.workers:
        for store_name in args.stores:
            print(json.dumps(run_config(store_name, n, args)), flush=True)


if __name__ == "__main__":
    main()
