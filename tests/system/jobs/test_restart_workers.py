"""``elastic-run --restart-workers``: a torchrun script (``examples/torchrun/train_ddp.py``,
as PyTorch's DDP tutorial writes them: ``init_process_group("gloo")`` from the
environment, ``DistributedDataParallel``, a ``DistributedSampler``, its own checkpoint
every epoch) runs unchanged; a worker SIGKILLed mid-run restarts the whole world, and the
script's own resume logic carries the training to the same model an uninterrupted run
makes. The worlds themselves (a host that discovery adds, a driver taken over) with
``workloads/world_gate.py``, which needs no torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from rendezvous import open_store
from rendezvous.keys import JobKeys
from tests.support.jobs import (
    ROOT,
    WORKLOADS,
    ElasticRun,
    hosts_file_discovery,
    wait_until,
    write_hosts,
)

EXAMPLE = ROOT / "examples" / "torchrun" / "train_ddp.py"
WORLD_GATE = WORKLOADS / "world_gate.py"
EPOCHS, BATCH = 8, 8
#: torchrun sets it for several workers per host, and so does the world's entry; the
#: test's own replay gets the same, for the same arithmetic
THREADS = {"OMP_NUM_THREADS": "1"}


def example() -> ModuleType:
    """The example script as a module: its data, model and sampler, for the replay."""
    spec = importlib.util.spec_from_file_location("train_ddp", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def uninterrupted(world: int, epochs: int, batch: int, lr: float = 0.05) -> dict:
    """The weights an uninterrupted run of the example makes on ``world`` ranks: the
    same batches, each step's gradient the mean of the ranks' (what DDP averages)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    script = example()
    torch.set_num_threads(1)
    dataset = script.load_digits()
    model = script.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    samplers = [script.make_sampler(dataset, rank, world) for rank in range(world)]
    loaders = [DataLoader(dataset, batch_size=batch, sampler=s) for s in samplers]
    for epoch in range(epochs):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        for batches in zip(*loaders):
            grads = []
            for x, y in batches:
                model.zero_grad()
                F.cross_entropy(model(x), y).backward()
                grads.append([p.grad.clone() for p in model.parameters()])
            for p, *each in zip(model.parameters(), *grads):
                p.grad = sum(each) / world
            optimizer.step()
    return model.state_dict()


def starts(output: str) -> list[tuple[int, int, int]]:
    """(rank, restart count, first epoch) of each worker start the script printed."""
    found = re.findall(r"rank (\d+)/\d+: restart (\d+), starting at epoch (\d+)", output)
    return [(int(r), int(c), int(e)) for r, c, e in found]


@pytest.mark.timeout(90)
def test_a_torchrun_script_runs_unchanged_and_a_sigkill_restarts_the_whole_world(tmp_path):
    import torch

    ckpt = tmp_path / "ckpt"
    command = ["python", str(EXAMPLE), str(ckpt), "--epochs", str(EPOCHS)]
    args = ["--restart-workers", "-np", "2", *command, "--batch-size", str(BATCH)]
    with ElasticRun(args, tmp_path, env=THREADS) as run:
        run.wait_output(r"^\[0\] epoch 1:", timeout=60)  # two epochs checkpointed
        world = run.events("world_started")[0]
        victim = run.worker_pids()[world["members"][1]]
        os.kill(victim, signal.SIGKILL)
        assert run.wait(timeout=60) == 0, run.stderr_tail()
        output = run.output()
        stopping = run.events("world_stopping")
        worlds = [(e["world"], e["restarts"], e["size"]) for e in run.events("world_started")]
        done = run.events("job_done")
    assert worlds == [(1, 0, 2), (2, 1, 2)]
    assert len(stopping) == 1 and stopping[0]["failure"]
    assert "killed by SIGKILL" in stopping[0]["reason"]
    assert done and done[0]["world"] and done[0]["resets"] == 1
    seen = starts(output)
    assert sorted((rank, restart) for rank, restart, _ in seen) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    resumed = {epoch for _, restart, epoch in seen if restart == 1}
    assert len(resumed) == 1 and resumed.pop() >= 2  # after the epochs checkpointed
    state = torch.load(Path(ckpt) / "checkpoint.pt", map_location="cpu")
    assert state["epoch"] == EPOCHS - 1
    assert [h["epoch"] for h in state["history"]] == list(range(EPOCHS))
    assert {h["restart"] for h in state["history"]} == {0, 1}
    expected = uninterrupted(2, EPOCHS, BATCH)
    for name, value in state["model"].items():
        assert torch.allclose(value, expected[name], rtol=1e-4, atol=1e-6), name


def told(out: Path) -> list[dict]:
    """What each ``world_gate.py`` process was told, by the order its file came."""
    files = sorted(out.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    return [json.loads(p.read_text()) for p in files]


@pytest.mark.timeout(60)
def test_a_host_that_discovery_adds_restarts_the_world_bigger_not_as_a_restart(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script, hosts_file = hosts_file_discovery(tmp_path, "a:1\n")
    args = [
        *("--restart-workers", "--min-np", "1", "--launcher", "local"),
        *("--host-discovery-script", str(script), "--discovery-interval", "0.2"),
        *(sys.executable, str(WORLD_GATE), str(out)),
    ]
    with ElasticRun(args, tmp_path) as run:
        wait_until(lambda: len(told(out)) == 1, 30, "world 1's worker")
        write_hosts(hosts_file, "a:1\nb:1\n")
        wait_until(lambda: len(told(out)) == 3, 30, "world 2's workers")
        (out / "done").touch()
        assert run.wait(timeout=30) == 0, run.stderr_tail()
        worlds = [(e["world"], e["restarts"], e["size"]) for e in run.events("world_started")]
        (stopping,) = run.events("world_stopping")
    assert worlds == [(1, 0, 1), (2, 0, 2)]
    assert not stopping["failure"] and "the world grows from 1" in stopping["reason"]
    first, *second = (t["env"] for t in told(out))
    assert (first["RANK"], first["WORLD_SIZE"]) == ("0", "1")
    ranks = sorted((e["RANK"], e["GROUP_RANK"], e["WORLD_SIZE"]) for e in second)
    assert ranks == [("0", "0", "2"), ("1", "1", "2")]
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in second} == {"0"}
    assert len({e["MASTER_PORT"] for e in second}) == 1  # one master, a port of its own
    assert not [k for e in (first, *second) for k in e if k.startswith("ELASTIC_")]


@pytest.mark.timeout(60)
def test_warm_spares_take_the_seats_of_the_restarted_world(tmp_path):
    """``--spares 2``: the world after a SIGKILL is the two spares that were waiting,
    each running the program in its own process (the pid the driver started) with the
    seat's ranks, a restart count of 1, rank 0's address and none of the job's wiring;
    new spares start behind them."""
    out = tmp_path / "out"
    out.mkdir()
    args = ["--restart-workers", "-np", "2", "--spares", "2", sys.executable, str(WORLD_GATE)]
    with ElasticRun([*args, str(out)], tmp_path) as run:
        run.wait_event("spare_ready", timeout=30, after=1)  # both spares waiting
        first = run.events("world_started")[0]
        os.kill(run.worker_pids()[first["members"][1]], signal.SIGKILL)
        second = run.wait_event("world_started", lambda e: e["world"] == 2, timeout=30)
        wait_until(lambda: len(told(out)) == 4, 30, "world 2's workers")
        run.wait_event("spare_ready", timeout=30, after=3)  # the pool refilled
        (out / "done").touch()
        assert run.wait(timeout=30) == 0, run.stderr_tail()
        promoted = [e["worker"] for e in run.events("spare_promoted")]
        pids = run.worker_pids()
    assert sorted(promoted) == sorted(second["members"]) and second["restarts"] == 1
    restarted = [t for t in told(out) if t["env"]["TORCHELASTIC_RESTART_COUNT"] == "1"]
    assert sorted(t["pid"] for t in restarted) == sorted(pids[w] for w in promoted)
    assert sorted(t["env"]["RANK"] for t in restarted) == ["0", "1"]
    assert len({t["env"]["MASTER_PORT"] for t in restarted}) == 1
    assert not [k for t in restarted for k in t["env"] if k.startswith("ELASTIC_")]


@pytest.mark.timeout(90)
def test_a_driver_sigkilled_and_started_again_adopts_the_world_which_goes_on(tmp_path, etcd_server):
    """With etcd the workers outlive their driver; the same command started again takes
    the job over and keeps the world as it is: no restart, the job ends in world 1."""
    job_id = f"t{uuid.uuid4().hex[:10]}"
    out = tmp_path / "out"
    out.mkdir()
    secret = {"ELASTIC_JOB_SECRET": uuid.uuid4().hex * 2}
    args = [
        *("--restart-workers", "-np", "2", "--rendezvous", etcd_server.url, "--job-id", job_id),
        *(sys.executable, str(WORLD_GATE), str(out)),
    ]
    first = ElasticRun(args, tmp_path / "first", env=secret).start()
    again = ElasticRun(args, tmp_path / "again", env=secret)

    def leader_gone() -> bool:
        with open_store(etcd_server.url) as store:
            return store.get(JobKeys(job_id).driver) is None

    try:
        wait_until(lambda: len(told(out)) == 2, 60, "world 1's workers")
        assert first.proc is not None
        os.kill(first.proc.pid, signal.SIGKILL)
        wait_until(leader_gone, 20, "the leader key to lapse")
        again.start()
        leading = again.wait_event("leading", timeout=30)
        assert leading["how"] == "adopted" and leading["adopted"] == 2
        (out / "done").touch()
        assert again.wait(timeout=30) == 0, again.stderr_tail()
        done = again.events("job_done")
        assert not again.events("world_stopping") and not again.events("world_started")
    finally:
        again.stop()
        first.stop()
    assert len(told(out)) == 2  # the world went on: nobody was started again
    assert done and (done[0]["round"], done[0]["resets"], done[0]["world"]) == (1, 0, True)
