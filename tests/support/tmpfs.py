"""A small real filesystem that fills up: a tmpfs of a given size mounted for one test
(the tests run as root on Linux; elsewhere the test is skipped), and ballast that
takes its free space."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "2m") -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (made, mode 0700: a checkpoint directory must be
    private), unmounted on exit."""
    path.mkdir(mode=0o700)
    options = f"size={size},mode=0700"
    mount = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)]
    subprocess.run(mount, check=True, timeout=30)
    try:
        yield path
    finally:
        # lazily if still busy: a process of a failed test may hold a file there
        if subprocess.run(["umount", str(path)], check=False, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True, timeout=30)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int, name: str = "ballast") -> Path:
    """A ballast file ``name`` in ``path`` that leaves only about ``leave`` bytes free;
    its path."""
    ballast = path / name
    with open(ballast, "wb") as f:
        f.write(b"\0" * max(free_bytes(path) - leave, 0))
    return ballast
