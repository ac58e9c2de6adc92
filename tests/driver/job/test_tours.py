"""The tours of ``docs/DESIGN.md`` ("Tours: three journeys through the code"), pinned.

Each tour is a numbered list of ``file:function`` hops. Every hop must name a function
that exists, and each tour's scenario is run here on the driver's real loop (fake
processes, a fake clock, a real embedded store) with every Python call recorded: the
hops from the first one this process runs must come up in that order. A rename, a new
hop between two parts, or a handler table that dispatches elsewhere fails here until the
tour says so too.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from driver.config import parse_args
from driver.hosts.discovery import HostDiscovery
from driver.hosts.slots import HostSlots
from driver.job.loop import Job
from tests.driver.job.test_loop import Events, FakeClock, FakeLauncher, register, turn_until
from tests.support.paths import ROOT

DESIGN = ROOT / "docs" / "DESIGN.md"
HOP = re.compile(r"^\d+\. `(?P<path>[\w/]+\.py):(?P<name>[\w.]+)`", re.MULTILINE)
SIGKILL_MOST_HOPS = 20


def tour(title: str) -> list[str]:
    """The hops of the tour titled ``title`` in DESIGN.md, as ``path:qualname``."""
    text = DESIGN.read_text()
    start = text.index(f"### Tour: {title}\n")
    end = text.find("\n#", start + 1)
    body = text[start : end if end != -1 else len(text)]
    hops = [f"{m['path']}:{m['name']}" for m in HOP.finditer(body)]
    assert hops, f"the tour {title!r} lists no hop"
    return hops


def resolve(hop: str) -> object:
    """The function a hop names (its module imported, its qualified name walked)."""
    path, name = hop.split(":")
    thing: object = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    for part in name.split("."):
        thing = getattr(thing, part)
    return thing


@contextmanager
def recorded() -> Iterator[list[str]]:
    """Record, as ``path:qualname``, every call into the project's code on any thread
    (those already running included) while inside."""
    calls: list[str] = []
    root = str(ROOT) + os.sep

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            calls.append(f"{frame.f_code.co_filename[len(root) :]}:{frame.f_code.co_qualname}")

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def assert_in_order(hops: list[str], calls: list[str]) -> None:
    """``hops`` come up in ``calls`` in that order (others may come between)."""
    at = 0
    for hop in hops:
        try:
            at = calls.index(hop, at) + 1
        except ValueError:
            seen = sorted({c for c in calls if c.split(":")[0] == hop.split(":")[0]})
            pytest.fail(f"hop {hop} not called after the one before it; in its file: {seen}")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("title", ["a worker's SIGKILL", "a discovery change", "--checkpoint-dir"])
def test_every_hop_of_a_tour_exists(title):
    for hop in tour(title):
        assert callable(resolve(hop)), hop


@pytest.mark.timeout(30)
def test_the_sigkill_tour_is_short():
    assert len(tour("a worker's SIGKILL")) <= SIGKILL_MOST_HOPS


def _job(*flags: str, discovery: HostDiscovery | None = None):
    clock, launcher = FakeClock(), FakeLauncher()
    job = Job(
        parse_args([*flags, "python", "train.py"]),
        launcher=launcher,
        events=Events(),
        clock=clock,
        discovery=discovery,
    )
    return job, launcher, clock


def _first_round(job: Job, size: int) -> None:
    turn_until(job, lambda: len(job.workers) == size, f"{size} launches")
    for worker_id in list(job.workers):
        register(job, worker_id)
    turn_until(job, lambda: job.plan is not None, "round 1")


@pytest.mark.timeout(60)
def test_a_worker_s_sigkill_goes_the_tour_s_way_to_the_next_round():
    """The exit of a member killed by SIGKILL, from its waiter thread to the survivors'
    round written in the store (the hops before run on its host, in its agent)."""
    hops = tour("a worker's SIGKILL")
    # (the driver's waiter thread was called at the launch: the exit is its post)
    in_driver = hops[hops.index("driver/job/loop.py:Job.post") :]
    with recorded() as calls:
        job, launcher, clock = _job("-np", "2", "--min-np", "1")
        try:
            job.open()
            _first_round(job, 2)
            del calls[:]
            clock.advance(5)
            launcher.by_worker(job.plan.worker_ids[1]).exit(-9)
            turn_until(job, lambda: job.plan.round_id == 2, "the survivors' round")
        finally:
            job.close()
    assert_in_order(in_driver, calls)


class ChangingHosts(HostDiscovery):
    """A discovery whose hosts the test changes."""

    def __init__(self, hosts: str):
        self.hosts = hosts

    def find_hosts(self) -> tuple[HostSlots, ...]:
        return tuple(
            HostSlots(name, int(slots))
            for name, slots in (h.split(":") for h in self.hosts.split(","))
        )


@pytest.mark.timeout(60)
def test_a_discovery_change_goes_the_tour_s_way_to_a_bigger_round(tmp_path):
    """A host the discovery finds, from its poll to the round that takes its workers in."""
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho a:1\n")
    script.chmod(0o700)
    discovery = ChangingHosts("a:1")
    with recorded() as calls:
        job, _, _ = _job(
            *("-np", "1", "--min-np", "1", "--max-np", "2", "--launcher", "local"),
            *("--host-discovery-script", str(script), "--discovery-interval", "0.05"),
            discovery=discovery,
        )
        try:
            job.open()
            _first_round(job, 1)
            del calls[:]
            discovery.hosts = "a:1,b:1"
            turn_until(job, lambda: len(job.workers) == 2, "a launch on the new host")
            (newcomer,) = [w for w in job.workers if job.workers[w].host == "b"]
            register(job, newcomer)
            turn_until(job, lambda: job.plan.size == 2, "the round of both hosts")
        finally:
            job.close()
    # (the poll's thread started at open; the test's discovery stands for the script)
    hops = tour("a discovery change")
    assert_in_order(hops[hops.index("driver/job/loop.py:Job.post") :], calls)


@pytest.mark.timeout(60)
def test_the_checkpoint_dir_goes_the_tour_s_way_to_the_worker_s_snapshotter(tmp_path):
    """``--checkpoint-dir`` from the flag to the variable a worker is started with, and
    from that variable to the settings its snapshotter writes with (the worker's side
    read in this process, from the environment the launch was given)."""
    from elastic.snapshots.settings import SnapshotSettings

    hops = tour("--checkpoint-dir")
    writer = hops.index("elastic/snapshots/snapshotter.py:Snapshotter.on_commit")
    folder = str(tmp_path / "snapshots")
    with recorded() as calls:
        job, launcher, _ = _job("-np", "1", "--checkpoint-dir", folder)
        try:
            job.open()
            turn_until(job, lambda: launcher.processes, "a launch")
        finally:
            job.close()
        settings = SnapshotSettings.from_env(launcher.processes[0].spec.env)
    assert settings is not None and settings.directory == folder
    # (what comes after runs in the worker, on a commit: its hops are checked to exist)
    assert_in_order(
        [h for h in hops[:writer] if h != "elastic/snapshots/worlds.py:snapshots_of_job"], calls
    )
