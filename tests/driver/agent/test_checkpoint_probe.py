"""The agent's look at a host-local ``--checkpoint-dir`` before it starts a worker: a
real folder, made unwritable even for root."""

from __future__ import annotations

from driver.agent.folders import checkpoint_dir_problem
from tests.support.unwritable import unwritable


def test_a_host_that_cannot_write_in_the_checkpoint_dir_says_so_naming_it(tmp_path):
    with unwritable(tmp_path / "ckpt") as folder:
        problem = checkpoint_dir_problem("hostA", str(folder))
        assert list(folder.iterdir()) == []
    assert problem is not None
    assert problem.startswith("on host hostA: --checkpoint-dir ") and "cannot write" in problem
    assert str(folder) in problem


def test_a_missing_folder_is_made_private_and_passes(tmp_path):
    folder = tmp_path / "new" / "ckpt"
    assert checkpoint_dir_problem("hostA", str(folder)) is None
    assert folder.is_dir() and folder.stat().st_mode & 0o077 == 0
