"""The ps supervisor with real processes and a real embedded store: shards announce
readiness and checkpoints only through the store (``ShardInfo`` under ``ps_shard(i)``,
``CheckpointRecord`` under ``ps_checkpoint``, ``CheckpointFailedRecord`` under
``ps_checkpoint_failed``); the supervisor watches those keys.

The shard here is a stand-in (a few lines of Python writing the records a real shard
writes, from the environment the supervisor gives it), so these tests prove the
supervisor's side of the contract whatever the real shard does.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import uuid

import pytest

from driver.config import parse_args
from driver.errors import JobFailed
from driver.job.wiring import job_env
from driver.launch.local import LocalLauncher
from driver.policy.ps_restarts import RestartLimits
from driver.ps.supervisor import PSSupervisor, ShardLaunch, SupervisionSettings
from rendezvous import open_store
from rendezvous.keys import JobKeys
from rendezvous.schema.ps import CheckpointRecord, ShardInfo
from tests.support.jobs import wait_until
from tests.support.paths import ROOT

# argv: INDEX NUM_SHARDS MODE. Modes: "serve" (ready, shard 0 also writes a checkpoint,
# then waits for a signal), "restoring" (never gets ready), "crash" (ready, then exit 3),
# "early" (exit 3 before any record), "full" (as "serve", but on SIGTERM shard 0 says
# its final checkpoint could not be written, and exits 0), "stubborn" (as "serve", but
# ignores SIGTERM).
FAKE_SHARD = """
import os, signal, sys
from rendezvous import env, open_store
from rendezvous.keys import JobKeys
from rendezvous.schema.ps import CheckpointFailedRecord, CheckpointRecord, ShardInfo
index, num_shards, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if mode == "early":
    sys.exit(3)
store = open_store(env.text(env.ENV_RENDEZVOUS), env.text(env.ENV_SECRET))
keys = JobKeys(env.text(env.ENV_JOB_ID))
def full(*_):
    failed = CheckpointFailedRecord(4, 30, "/ckpt", "cannot write /ckpt/x: No space left on "
                                    "device", attempts=3, final=True, newest=1, newest_step=10)
    store.put(keys.ps_checkpoint_failed, failed.to_json())
    os._exit(0)
if mode == "full" and index == 0:
    signal.signal(signal.SIGTERM, full)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
info = ShardInfo(index, num_shards, f"127.0.0.1:{7100 + index}", os.getpid(), ready=False)
store.put(keys.ps_shard(index), info.to_json())
if mode == "restoring":
    signal.pause()
store.put(keys.ps_shard(index), ShardInfo(index, num_shards, info.address, os.getpid(),
                                          ready=True).to_json())
if mode == "crash":
    sys.exit(3)
if index == 0:
    store.put(keys.ps_checkpoint, CheckpointRecord(1, step=10, dir="/ckpt", pause_ms=5.0,
                                                   write_ms=20.0).to_json())
signal.pause()
"""


class Events(list):
    def emit(self, event):
        self.append(event)
        return event

    def of(self, kind: str) -> list:
        return [e for e in self if e.kind == kind]


@pytest.fixture
def supervise(embedded_server):
    made = []
    url = f"embedded://{embedded_server.address}"

    def make(
        *modes: str,
        ready_timeout: float = 30.0,
        checkpoints: bool = False,
        restarts: RestartLimits | None = None,
    ):
        keys = JobKeys(f"t{uuid.uuid4().hex[:10]}")
        store = open_store(url, embedded_server.secret)
        config = parse_args(["-np", "1", "--job-id", keys.job_id, "python", "x.py"])
        environment = {**job_env(config, embedded_server.secret, url), "PYTHONPATH": str(ROOT)}
        fatal: list[str] = []
        events = Events()
        commands = [
            (sys.executable, "-c", FAKE_SHARD, str(i), str(len(modes)), mode)
            for i, mode in enumerate(modes)
        ]
        settings = SupervisionSettings(
            ready_timeout=ready_timeout,
            store_patience=30.0,
            checkpoints=checkpoints,
            restarts=restarts or RestartLimits(),
        )
        sup = PSSupervisor(
            ShardLaunch(LocalLauncher(io.BytesIO(), io.BytesIO()), tuple(commands), environment),
            settings,
            store=store,
            keys=keys,
            events=events,
            on_fatal=fatal.append,
        )
        made.append((sup, store))
        return sup, store, keys, events, fatal

    yield make
    for sup, store in made:
        sup.stop()
        store.close()


def test_shards_are_ready_through_the_store_and_checkpoints_are_events(supervise):
    sup, _, _, events, fatal = supervise("serve", "serve")
    sup.start()
    started = {e.shard: e for e in events.of("ps_started")}
    assert set(started) == {0, 1} and not fatal
    assert started[1].address == "127.0.0.1:7101" and started[1].pid == sup.primary_pid(1)
    wait_until(lambda: events.of("checkpoint_written"), 15, "the checkpoint event")
    (checkpoint,) = events.of("checkpoint_written")
    assert (checkpoint.checkpoint, checkpoint.step, checkpoint.path, checkpoint.seconds) == (
        1,
        10,
        "/ckpt",
        0.025,
    )


def test_a_stale_record_of_another_process_is_not_readiness(supervise):
    sup, store, keys, events, _ = supervise("restoring", ready_timeout=3.0)
    # A ready record left by a shard 0 that died: its pid is not the new process's.
    stale = ShardInfo(0, 1, "127.0.0.1:1", pid=2**22 + 7, ready=True)
    store.put(keys.ps_shard(0), stale.to_json())
    with pytest.raises(JobFailed, match=r"ps shards \[0\] not ready within 3s"):
        sup.start()
    # Nor is the new process's own record while it says it is restoring.
    pid = sup.primary_pid(0)

    def own_record():
        kv = store.get(keys.ps_shard(0))
        return kv is not None and ShardInfo.from_json(kv.value).pid == pid

    wait_until(own_record, 30, "the shard's own record")
    sup._records.take(store.get(keys.ps_shard(0)))
    assert events.of("ps_started") == []


def test_a_killed_shard_is_restarted_and_ready_again_with_its_new_pid(supervise):
    sup, _, _, events, fatal = supervise("serve", "serve")
    sup.start()
    old = sup.primary_pid(1)
    os.kill(old, signal.SIGKILL)
    wait_until(
        lambda: [e for e in events.of("ps_started") if e.shard == 1 and e.pid != old],
        30,
        "shard 1 ready again",
    )
    assert [(e.shard, e.code) for e in events.of("ps_exited")] == [(1, -signal.SIGKILL)]
    assert [e.shard for e in events.of("ps_restarted")] == [1] and not fatal


def test_a_restart_says_the_checkpoint_it_goes_back_to_and_the_steps_after_it_lost(supervise):
    """The job checkpoints, and shard 0 said checkpoint 1 of step 10 is complete: shard 1
    killed comes back from it, and the restart says the updates after step 10 are lost."""
    sup, _, _, events, fatal = supervise("serve", "serve", checkpoints=True)
    sup.start()
    wait_until(lambda: events.of("checkpoint_written"), 15, "the checkpoint event")
    os.kill(sup.primary_pid(1), signal.SIGKILL)
    wait_until(lambda: events.of("ps_restarted"), 30, "shard 1 restarted")
    (restarted,) = events.of("ps_restarted")
    assert (restarted.shard, restarted.checkpoint, restarted.step) == (1, 1, 10) and not fatal
    assert str(restarted) == (
        "ps shard 1 restarted from checkpoint 1 at step 10: what it applied after step 10 is lost"
    )


def test_a_shard_dying_over_and_over_is_fatal(supervise):
    sup, _, _, events, fatal = supervise("crash", restarts=RestartLimits(max_restarts=1))
    sup.start()  # ready once: then it keeps dying
    wait_until(lambda: fatal, 30, "the supervisor to give up")
    assert fatal == ["ps shard 0 died 2 times within 60s (last exit: 3); giving up"]
    assert [e.code for e in events.of("ps_exited")] == [3, 3]


def test_start_ends_at_once_when_the_shards_cannot_go_on(supervise):
    limits = RestartLimits(max_restarts=1)
    sup, _, _, _, fatal = supervise("early", ready_timeout=60.0, restarts=limits)
    with pytest.raises(JobFailed, match="ps shard 0 died 2 times"):
        sup.start()
    assert len(fatal) == 1


def test_each_checkpoint_is_reported_once(supervise):
    sup, store, keys, events, _ = supervise("serve")
    sup.start()
    wait_until(lambda: events.of("checkpoint_written"), 15, "the first checkpoint")
    record = CheckpointRecord(2, step=20, dir="/ckpt", pause_ms=1.0, write_ms=1.0).to_json()
    store.put(keys.ps_checkpoint, record)
    store.put(keys.ps_checkpoint, record)  # the same checkpoint, written again
    store.put(keys.ps_checkpoint, CheckpointRecord(3, step=30, dir="/ckpt").to_json())
    wait_until(lambda: len(events.of("checkpoint_written")) == 3, 15, "checkpoints 2 and 3")
    assert [e.checkpoint for e in events.of("checkpoint_written")] == [1, 2, 3]


def test_a_final_checkpoint_shard_0_could_not_write_is_said_and_is_why_stop_says_so(supervise):
    sup, _, _, events, _ = supervise("full", "serve", checkpoints=True)
    sup.start()
    lost = sup.stop()
    (failed,) = events.of("checkpoint_failed")
    assert failed.final and (failed.checkpoint, failed.newest, failed.newest_step) == (4, 1, 10)
    assert (
        lost
        == str(failed)
        == (
            "final ps checkpoint not written to /ckpt: cannot write /ckpt/x: No space left on "
            "device; a restart resumes from checkpoint 1 of step 10 (20 steps lost)"
        )
    )
    assert sup.stop() == lost  # once stopped, the same answer


def test_a_shard_0_killed_before_its_final_checkpoint_is_why_stop_says_so(supervise):
    sup, _, _, events, _ = supervise("stubborn", checkpoints=True)
    sup.start()
    lost = sup.stop(coordinator_grace=0.5)
    assert lost is not None and lost.startswith(
        "ps shard 0 was killed by SIGKILL before it wrote a final checkpoint"
    )
    assert events.of("checkpoint_failed") == []
