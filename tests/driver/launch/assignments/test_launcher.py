"""The driver's side of the agents (``driver.launch.assignments.launcher.AgentLauncher``) against a real
embedded store: what it writes when a host's agent is lost."""

from __future__ import annotations

import signal
import uuid

import pytest

from driver.launch.assignments.launcher import AgentLauncher
from driver.launch.assignments.service import AgentStarts, AgentWiring
from driver.launch.registry import get_launcher
from rendezvous import open_store
from rendezvous.keys import JobKeys
from rendezvous.schema.agents import AgentRecord, Assignment, ProcessStatus
from tests.support.jobs import wait_until


@pytest.fixture
def store(embedded_server):
    client = open_store(f"embedded://{embedded_server.address}", embedded_server.secret)
    try:
        yield client
    finally:
        client.close()


def adopting(store, keys: JobKeys, lost: list[str]) -> tuple[AgentLauncher, dict]:
    """A launcher that took over ``keys``' job from the store (its handles by process
    id), attached; the hosts it takes as lost are appended to ``lost``."""
    local = get_launcher("local")
    launcher = AgentLauncher(
        local, local, AgentStarts(keys.job_id, 60, detach=True), use_agent=lambda h: True
    )
    handles = launcher.adopt(store.get_prefix(keys.prefix)[0])
    launcher.attach(
        AgentWiring(
            store,
            agent_env={},
            on_host_lost=lambda host, detail: lost.append(host),
            patience=10.0,
        )
    )
    return launcher, handles


@pytest.mark.timeout(30)
def test_a_lost_agents_assignments_are_withdrawn_so_no_later_agent_reruns_them(store):
    """The agent of h1 lost (its lease lapsed): the job hears of it, its processes are
    taken as SIGKILLed, and every assignment of h1 is deleted: a fresh agent on h1,
    once the host is back, must not start the lost worker or a second copy of the ps
    shard. Another host's assignments stay; those of a host whose agent was already
    gone when this driver took the job over are withdrawn when it attaches."""
    keys = JobKeys(f"t{uuid.uuid4().hex[:10]}")
    lease = store.grant_lease(1)
    store.put(keys.agent("h1"), AgentRecord("h1", 11, 1.0, 1, "", "ag1").to_json(), lease=lease)
    store.put(keys.agent("h2"), AgentRecord("h2", 12, 1.0, 1, "", "ag2").to_json())
    for host, process_id, kind in (
        ("h1", "h1-0-1", "worker"),
        ("h1", "ps0-1", "shard"),
        ("h1", "h1-1-2", "worker"),  # exited long ago: no later agent may rerun it either
        ("h2", "h2-0-3", "worker"),
        ("h3", "h3-0-4", "worker"),  # its agent was gone before the takeover
    ):
        assignment = Assignment(process_id, kind, 0, ("python", "x.py"), term=1, label=host)
        store.put(keys.assignment(host, process_id), assignment.to_json())
        state = "exited" if process_id == "h1-1-2" else "running"
        status = ProcessStatus(process_id, host, 100, state, 1.0, term=1)
        store.put(keys.process(host, process_id), status.to_json())
    lost: list[str] = []
    launcher, handles = adopting(store, keys, lost)
    assert set(handles) == {"h1-0-1", "ps0-1", "h2-0-3"}  # not h3's: no agent there
    try:
        # h3's agent was lost under the predecessor: nothing of h3's is adopted, and its
        # assignments are withdrawn as for a host lost now.
        wait_until(lambda: not store.get_prefix(keys.assignments("h3"))[0], 10, "h3's withdrawal")
        lease.revoke()  # the agent of h1 stops refreshing its record: it is gone
        wait_until(lambda: lost, 10, "the driver to take h1 as lost")
        assert lost == ["h1"] and launcher.lost_hosts() == {"h1"}
        assert handles["h1-0-1"].wait(10) == -signal.SIGKILL
        assert handles["ps0-1"].wait(10) == -signal.SIGKILL
        assert handles["h2-0-3"].poll() is None
        wait_until(lambda: not store.get_prefix(keys.assignments("h1"))[0], 10, "h1's withdrawal")
        # Stopping a lost process writes nothing back for h1's next agent to run.
        handles["h1-0-1"].kill()
        assert not store.get_prefix(keys.assignments("h1"))[0]
        assert [kv.key for kv in store.get_prefix(keys.assignments("h2"))[0]] == [
            keys.assignment("h2", "h2-0-3")
        ]
    finally:
        launcher.stop_following()


@pytest.mark.timeout(30)
def test_an_adopted_agent_is_retired_through_the_store_and_its_leaving_is_no_loss(store):
    """A predecessor's agent (no process handle here) of a host discovery removed: the
    retirement is a key naming that agent, and its record's end is no lost host."""
    keys = JobKeys(f"t{uuid.uuid4().hex[:10]}")
    lease = store.grant_lease(5)
    store.put(keys.agent("h4"), AgentRecord("h4", 14, 1.0, 1, "", "ag4").to_json(), lease=lease)
    lost: list[str] = []
    launcher, _ = adopting(store, keys, lost)
    try:
        assert launcher.live_hosts() == {"h4"} and not launcher.busy_hosts()
        launcher.retire("h4")
        record = store.get(keys.retire("h4"))
        assert record is not None and record.value == b"ag4"
        assert not launcher.live_hosts()  # retiring: not asked twice, not reused
        lease.revoke()  # the agent unregisters as it exits
        wait_until(lambda: not store.get(keys.agent("h4")), 10, "h4's record to go")
        # The driver's watch takes the deletion as the retirement's end, not a loss.
        wait_until(lambda: "h4" not in launcher._book.agents, 10, "h4's agent to be forgotten")
        assert not lost and not launcher.lost_hosts()
    finally:
        launcher.stop_following()
