"""Long chaos runs, left out of the default suite: ``./scripts/test -m long``.

Many random SIGKILLs and SIGSTOPs while discovery grows and shrinks the world; the
job must still finish with the exact result."""

from __future__ import annotations

import random
import signal

import pytest

from tests.support.jobs import ElasticRun, check_exact_sum, hosts_file_discovery, write_hosts
from tests.system.faults.test_chaos import SAMPLES, workload

pytestmark = [pytest.mark.chaos, pytest.mark.long]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [1, 2])
def test_long_chaos_with_changing_hosts(tmp_path, store_args, seed):
    rng = random.Random(seed)
    out = tmp_path / "out"
    out.mkdir()
    script, hosts = hosts_file_discovery(tmp_path, "localhost:3\n")
    layouts = ["localhost:3\n", "localhost:2\n127.0.0.1:2\n", "127.0.0.1:2\n", "localhost:4\n"]
    with ElasticRun(
        [
            "--min-np",
            "2",
            "-np",
            "3",
            "--max-np",
            "4",
            "--host-discovery-script",
            str(script),
            "--discovery-interval",
            "0.2",
            "--launcher",
            "local",
            *store_args,
            *workload(out, epochs=120),
        ],
        tmp_path,
        env={"ELASTIC_PEER_TIMEOUT": "3"},
    ) as run:
        for _i in range(30):
            run.wait_progress(run.progress + rng.randint(20, 60), timeout=120)
            action = rng.random()
            if action < 0.15:
                write_hosts(hosts, rng.choice(layouts))
            elif action < 0.2:
                run.kill_member(rng.randrange(len(run.members())), signal.SIGSTOP)
            else:
                run.kill_member(rng.randrange(len(run.members())))
        assert run.wait(timeout=600) == 0, run.stderr_tail()
    check_exact_sum(out, SAMPLES, 120)
