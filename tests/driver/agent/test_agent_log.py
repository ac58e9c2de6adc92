"""The agent's log at its predictable path: never through a planted link, never another
user's file, and readable by its owner only (real files)."""

from __future__ import annotations

import os

import pytest

from driver.agent.output import open_log


def test_the_log_is_made_readable_by_its_owner_only(tmp_path):
    path = tmp_path / "agent.log"
    with open_log(str(path)) as log:
        log.write(b"one\n")
    with open_log(str(path)) as log:
        log.write(b"two\n")
    assert path.read_bytes() == b"one\ntwo\n"
    assert path.stat().st_mode & 0o777 == 0o600


def test_an_older_world_readable_log_is_made_private(tmp_path):
    path = tmp_path / "agent.log"
    path.write_bytes(b"old\n")
    path.chmod(0o644)
    open_log(str(path)).close()
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_planted_link_is_not_followed(tmp_path):
    target, path = tmp_path / "victim", tmp_path / "agent.log"
    target.write_bytes(b"")
    path.symlink_to(target)
    with pytest.raises(OSError, match=r"agent log .*agent\.log"):
        open_log(str(path))
    assert target.read_bytes() == b""


def test_another_users_file_is_refused(tmp_path):
    path = tmp_path / "agent.log"
    path.write_bytes(b"")
    os.chown(path, 12345, 12345)  # (the tests run as root)
    with pytest.raises(OSError, match="not a regular file of this user's"):
        open_log(str(path))
