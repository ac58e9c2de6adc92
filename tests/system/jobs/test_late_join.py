"""Workers that are slow to start, and a round that forms exactly as training ends.

``workloads/late_join.py`` trains a loop whose result every worker must share. A held
worker stands for a replacement that imports torch for seconds before ``elastic.init()``
(which registers it); a lingering worker for a survivor whose training function returns
just as the driver publishes a round with a newcomer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.jobs import WORKLOADS, ElasticRun, wait_until

SCRIPT = WORKLOADS / "late_join.py"


def results(out: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert found, f"no worker wrote a result into {out}"
    return sorted(found, key=lambda r: r["rank"])


def check_shared(out: Path, steps: int, size: int) -> list[dict]:
    """The final round's ``size`` workers all hold the whole training."""
    found = results(out)
    assert [r["rank"] for r in found] == list(range(size)), found
    assert {(r["steps"], r["total"], tuple(r["sizes"])) for r in found} == {
        (steps, found[0]["total"], tuple(found[0]["sizes"]))
    }, found
    return found


@pytest.mark.timeout(150)
def test_survivors_train_while_a_replacement_starts_then_it_joins(tmp_path):
    """At --min-np the survivors go on while the replacement is still "importing" (it has
    not called elastic.init(), so it is not registered and no round waits for it); once
    it is ready it joins at the next commit, and the three finish together."""
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    hold.mkdir()
    steps = 400
    argv = ["-np", "3", "--min-np", "2", "python", str(SCRIPT), str(out)]
    with ElasticRun(
        [*argv, "--steps", str(steps), "--step-time", "0.02", "--hold", str(hold)], tmp_path
    ) as run:
        run.wait_event("round_formed", lambda e: e["size"] == 3, timeout=60)
        run.wait_progress(20)
        (hold / "hold").write_text("")  # from now on a new worker is slow to start
        rounds = len(run.events("round_formed"))
        run.kill_member(2)
        run.wait_event("round_formed", lambda e: e["size"] == 2, timeout=60, after=rounds)
        waiting = wait_until(lambda: list(hold.glob("*.waiting")), 60, "a replacement")
        at_start = run.progress
        run.wait_progress(at_start + 30)  # the survivors train on meanwhile
        assert [e["size"] for e in run.events("round_formed")[rounds:]] == [2]  # nobody waits
        (hold / "go").write_text("")  # its imports are done: it registers
        joined = run.wait_event("round_formed", lambda e: e["size"] == 3, timeout=60, after=rounds)
        assert joined["members"][2] == waiting[0].stem  # the replacement, ranked last
        assert run.wait(timeout=90) == 0, run.stderr_tail()
    found = check_shared(out, steps, 3)
    assert found[0]["sizes"] == [3, 2, 3], found[0]


@pytest.mark.timeout(120)
def test_a_round_formed_as_training_ends_gets_the_final_state(tmp_path):
    """The lone survivor's training function returns just as a round with a newcomer is
    published. Recording the finish then fails (the round key moved on), so the survivor
    joins that round with its last commit and the newcomer gets the finished training:
    both end with the same state and no later round forms. (Before, the survivor left,
    and the newcomer waited for it in vain, then trained from scratch alone.)"""
    out, hold = tmp_path / "out", tmp_path / "hold"
    out.mkdir()
    hold.mkdir()
    steps = 150
    argv = ["-np", "2", "--min-np", "1", "python", str(SCRIPT), str(out)]
    extra = ["--steps", str(steps), "--step-time", "0.01", "--hold", str(hold)]
    with ElasticRun([*argv, *extra, "--linger", str(hold)], tmp_path) as run:
        run.wait_event("round_formed", lambda e: e["size"] == 2, timeout=60)
        run.wait_progress(20)
        (hold / "hold").write_text("")  # the replacement waits for the survivor to finish
        run.kill_member(1)
        wait_until((hold / "lingering").exists, 60, "the survivor to finish alone")
        (hold / "go").write_text("")
        assert run.wait(timeout=90) == 0, run.stderr_tail()
        sizes = [e["size"] for e in run.events("round_formed")]
    assert sizes == [2, 1, 2], sizes  # the newcomer's round is the last
    found = check_shared(out, steps, 2)
    assert found[0]["sizes"] == [2, 1], found[0]  # no step after the survivor's last
