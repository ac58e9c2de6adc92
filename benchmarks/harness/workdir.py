"""A temporary folder for one benchmark run's logs."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from pathlib import Path


@contextlib.contextmanager
def bench_workdir(prefix: str, keep: bool):
    """A temporary folder for the jobs' logs: removed afterwards, or kept (path on stderr)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield tmp
    finally:
        if keep:
            print(f"logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
