"""``elastic-run --restart-workers`` across test hosts (``tests/support/hosts/netns.py``):
a torchrun script (``examples/torchrun/train_ddp.py``) on two hosts, one of them cut off
the network mid-run (no FIN, no RST). Its agent's lease says the host is lost within
seconds (no collective timeout is waited out): the world stops, the next one runs on the
host left, with new ranks, and the script's own checkpoint carries the training to its
end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.jobs import ElasticRun
from tests.system.jobs.test_restart_workers import EXAMPLE, THREADS

pytestmark = pytest.mark.chaos

EPOCHS = 6


@pytest.mark.timeout(120)
def test_a_host_cut_restarts_the_world_on_the_host_left(three_hosts, tmp_path):
    import torch

    a, b, _ = three_hosts
    three_hosts.quick_resolver()  # torch's store looks its peers' names up
    ckpt = tmp_path / "ckpt"  # the hosts share the file system, as a cluster's home
    args = [
        *("--restart-workers", "-H", f"{a.address}:1,{b.address}:1", "-np", "2"),
        # b's cooldown ends while it is still cut: the world must not grow onto it (its
        # agent cannot start) and stop a healthy world for nothing, again and again
        *("--min-np", "1", "--launcher", "ssh", "--blacklist-cooldown-range", "1", "1"),
    ]
    command = ["python", str(EXAMPLE), str(ckpt), "--epochs", str(EPOCHS), "--batch-size", "8"]
    env = {**three_hosts.env(), **THREADS}
    try:
        with ElasticRun([*args, *command], tmp_path, env=env) as run:
            run.wait_output(r"^\[0\] epoch 1:", timeout=60)
            b.cut()
            lost = run.wait_event("host_unreachable", timeout=30)
            assert lost["host"] == b.address
            second = run.wait_event("world_started", lambda e: e["world"] == 2, timeout=30)
            assert (second["size"], second["hosts"], second["restarts"]) == (1, [a.address], 1)
            run.wait_event("host_back", lambda e: e["host"] == b.address, timeout=30)
            assert run.wait(timeout=90) == 0, run.stderr_tail()
            stopping = run.events("world_stopping")
            worlds = [e["world"] for e in run.events("world_started")]
    finally:
        b.restore()
    assert stopping[0]["failure"] and b.address in stopping[0]["reason"]
    assert worlds == [1, 2] and len(stopping) == 1, stopping
    state = torch.load(Path(ckpt) / "checkpoint.pt", map_location="cpu")
    assert [h["epoch"] for h in state["history"]] == list(range(EPOCHS))
    sizes = [h["world_size"] for h in state["history"]]
    assert sizes[:2] == [2, 2] and sizes[-1] == 1 and sizes == sorted(sizes, reverse=True)
