"""A folder that nobody, root included, can write in: for the tests of a checkpoint
folder refused up front."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def unwritable(folder: Path) -> Iterator[Path]:
    """``folder`` made unwritable even for root: immutable (``chattr +i``), or where the
    file system has no such attribute (tmpfs), a read-only bind mount of itself."""
    folder.mkdir(mode=0o700)
    immutable = ["chattr", "+i", str(folder)]
    if shutil.which("chattr") and subprocess.run(immutable, capture_output=True).returncode == 0:
        try:
            yield folder
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        return
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)
