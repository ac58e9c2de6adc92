"""The MPI backend under a real ``mpiexec -n 2``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from tests.support.session import run_in_session


@pytest.mark.timeout(120)
def test_battery_under_mpiexec_n2():
    mpiexec = shutil.which("mpiexec")
    assert mpiexec, "mpiexec is not on PATH (pip install -e .[mpi])"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # mpiexec and every rank it started are killed together if it hangs
    done = run_in_session(
        [mpiexec, "-n", "2", sys.executable, "-m", "tests.support.comm.mpi_script"],
        env,
        100,
        merge_stderr=True,
    )
    text = done.stdout
    assert done.returncode == 0, text
    assert "MPI_OK" in text, text


def test_package_imports_without_touching_mpi4py():
    code = (
        "import sys, elastic.comm as c; assert 'mpi4py' not in sys.modules; print(c.detect_mpi({}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=str(ROOT),
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=60,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
