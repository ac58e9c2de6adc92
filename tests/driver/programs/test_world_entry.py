"""How a worker of a world of restart mode begins (``driver.programs.world_entry``): rank 0
says where it serves, the others wait for it, then each becomes the command with
``MASTER_ADDR``/``MASTER_PORT`` and without the job's wiring. The pure parts, then real
processes against a real embedded store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from driver.errors import WorldEntryError
from driver.programs import world_entry
from driver.programs.world_entry import Entry, meet_master, program_env
from rendezvous import open_store
from rendezvous.keys import JobKeys
from rendezvous.schema.worlds import WorldMaster
from tests.support.paths import ROOT

MASTER = WorldMaster(world=2, address="10.0.0.5", port=29511, host="a")


def entry_env(url: str, secret: str, rank: int, **more: str) -> dict[str, str]:
    """What the driver gives a world's worker (``driver.job.wiring.world_spec``)."""
    return {
        "ELASTIC_RENDEZVOUS": url,
        "ELASTIC_JOB_SECRET": secret,
        "ELASTIC_JOB_ID": "job-e",
        "ELASTIC_WORKER_ID": f"w{rank}",
        "ELASTIC_HOST": "localhost",
        "ELASTIC_SLOT": str(rank),
        "ELASTIC_BIND_HOST": "127.0.0.1",
        "ELASTIC_ROUND_TIMEOUT": "20",
        "ELASTIC_WORLD": "2",
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        **more,
    }


@pytest.mark.unit
def test_the_program_gets_the_masters_address_and_none_of_the_wiring():
    inherited = {**entry_env("embedded://h:1", "s3cret", 1), "PATH": "/bin", "OMP_NUM_THREADS": "4"}
    env = program_env(inherited, MASTER, local_size=2, interface="eth0")
    assert env["MASTER_ADDR"] == "10.0.0.5" and env["MASTER_PORT"] == "29511"
    assert not {k for k in env if k.startswith("ELASTIC_")}  # the secret above all
    assert env["RANK"] == "1" and env["PATH"] == "/bin"
    assert env["OMP_NUM_THREADS"] == "4"  # the user's own stays
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"


@pytest.mark.unit
def test_one_openmp_thread_by_default_when_workers_share_a_host_as_torchrun_does():
    assert program_env({}, MASTER, 2, None)["OMP_NUM_THREADS"] == "1"
    alone = program_env({"GLOO_SOCKET_IFNAME": "ib0"}, MASTER, 1, "eth0")
    assert "OMP_NUM_THREADS" not in alone and alone["GLOO_SOCKET_IFNAME"] == "ib0"


@pytest.mark.unit
def test_what_the_driver_said_is_read_and_a_missing_variable_named():
    entry = Entry.from_env(entry_env("embedded://h:1", "s", 1))
    assert (entry.world, entry.rank, entry.world_size, entry.local_size) == (2, 1, 2, 2)
    assert (entry.bind_host, entry.timeout, entry.job_id) == ("127.0.0.1", 20.0, "job-e")
    with pytest.raises(WorldEntryError, match="ELASTIC_WORLD is not set"):
        Entry.from_env({k: v for k, v in entry_env("u", "s", 0).items() if k != "ELASTIC_WORLD"})
    with pytest.raises(WorldEntryError, match="RANK='x' is not a whole number"):
        Entry.from_env({**entry_env("u", "s", 0), "RANK": "x"})


@pytest.mark.unit
def test_a_program_that_cannot_run_exits_as_a_shell_says_it(tmp_path, capsys):
    assert world_entry.run([str(tmp_path / "missing")], {}) == 127
    plain = tmp_path / "plain.txt"
    plain.write_text("not a program")
    assert world_entry.run([str(plain)], {}) == 126
    assert "elastic-run: cannot start" in capsys.readouterr().err


def test_rank_0_says_where_it_serves_and_the_others_wait_for_it(embedded_server):
    url = f"embedded://{embedded_server.address}"
    got: list[WorldMaster] = []
    with open_store(url, embedded_server.secret) as store:
        waiter = threading.Thread(
            target=lambda: got.append(
                meet_master(Entry.from_env(entry_env(url, embedded_server.secret, 1)), store)
            )
        )
        waiter.start()
        master = meet_master(Entry.from_env(entry_env(url, embedded_server.secret, 0)), store)
        waiter.join(20)
        assert not waiter.is_alive()
        assert got == [master] and master.address == "127.0.0.1" and master.world == 2
        kv = store.get(JobKeys("job-e").world_master(2))
        assert kv is not None and WorldMaster.from_json(kv.value) == master


def test_a_worker_becomes_its_command_with_the_masters_address(embedded_server):
    """Both ranks as real processes: same pid before and after (exec), MASTER_* set, the
    wiring gone; a rank whose rank 0 never says anything ends with one line, exit 1."""
    url, secret = f"embedded://{embedded_server.address}", embedded_server.secret
    show = "import json, os; print(json.dumps({'pid': os.getpid(), 'env': dict(os.environ)}))"
    base = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "driver.programs.world_entry", "--", sys.executable, "-c", show]
    ranks = [
        subprocess.Popen(
            argv,
            env={**base, **entry_env(url, secret, rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (1, 0)
    ]
    outputs = []
    for proc in ranks:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outputs.append((proc.pid, json.loads(out)))
    for pid, seen in outputs:
        assert seen["pid"] == pid
        assert seen["env"]["MASTER_ADDR"] == "127.0.0.1" and int(seen["env"]["MASTER_PORT"]) > 0
        assert "ELASTIC_JOB_SECRET" not in seen["env"] and "ELASTIC_WORLD" not in seen["env"]
    assert outputs[0][1]["env"]["MASTER_PORT"] == outputs[1][1]["env"]["MASTER_PORT"]

    lonely = {
        **base,
        **entry_env(url, secret, 1),
        "ELASTIC_WORLD": "9",
        "ELASTIC_ROUND_TIMEOUT": "1",
    }
    done = subprocess.run(argv, env=lonely, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "cannot meet rank 0 of its world" in done.stderr
