"""The same training script, unchanged, under ``mpiexec -n 2`` (static world over MPI)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.jobs import EXACT_SUM, ROOT, check_exact_sum

MPIEXEC = shutil.which("mpiexec") or os.path.join(os.path.dirname(sys.executable), "mpiexec")


@pytest.mark.timeout(120)
def test_exact_sum_under_mpiexec(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTIC_")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [
            MPIEXEC,
            "-n",
            "2",
            sys.executable,
            str(EXACT_SUM),
            str(tmp_path),
            "--samples",
            "300",
            "--epochs",
            "3",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    results = check_exact_sum(tmp_path, 300, 3, final_size=2)
    assert results[0]["commits"] == 3 * -(-300 // (4 * 2))


@pytest.mark.timeout(120)
def test_layout_under_mpiexec(tmp_path):
    script = tmp_path / "layout.py"
    # One file per rank: mpiexec may interleave the ranks' output within a line.
    script.write_text(
        "import sys, elastic\nelastic.init()\n"
        "row = (elastic.rank(), elastic.size(), elastic.local_rank(), "
        "elastic.local_size(), elastic.cross_rank(), elastic.cross_size())\n"
        "open(f'{sys.argv[1]}/{elastic.rank()}.txt', 'w').write(' '.join(map(str, row)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTIC_")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [MPIEXEC, "-n", "2", sys.executable, str(script), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = sorted(tuple(map(int, p.read_text().split())) for p in tmp_path.glob("*.txt"))
    assert rows == [(0, 2, 0, 2, 0, 1), (1, 2, 1, 2, 0, 1)]
