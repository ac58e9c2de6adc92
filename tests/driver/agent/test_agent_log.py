"""The agent's log: in a folder of its user's own (0700), never through a planted link,
never another user's file, and readable by its owner only (real files and processes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from driver.agent.__main__ import default_log_path
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


def _agent(*args: str, tmp: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": tmp, "ELASTIC_RENDEZVOUS": "etcd://127.0.0.1:1"}
    env["ELASTIC_JOB_SECRET"] = "s" * 64
    return subprocess.run(
        [sys.executable, "-m", "driver.agent", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_default_log_is_in_a_folder_of_this_users_own(tmp_path):
    path = default_log_path("job1", "host/a")
    assert os.path.basename(os.path.dirname(path)) == f"elastic-agent-logs-{os.geteuid()}"
    # Run for real (its store unreachable: it ends after writing its first lines there).
    result = _agent("--job-id", "j1", "--host", "h1", "--detach", tmp=str(tmp_path))
    folder = tmp_path / f"elastic-agent-logs-{os.geteuid()}"
    assert folder.stat().st_mode & 0o777 == 0o700, result.stderr
    assert (folder / "j1-h1.log").stat().st_mode & 0o777 == 0o600


def test_a_log_folder_planted_by_another_user_is_refused_in_one_line(tmp_path):
    folder = tmp_path / f"elastic-agent-logs-{os.geteuid()}"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    result = _agent("--job-id", "j1", "--host", "h1", "--detach", tmp=str(tmp_path))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "the agents' log folder" in line and str(folder) in line and "writable by" in line
