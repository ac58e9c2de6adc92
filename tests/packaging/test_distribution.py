"""What a user installing from a package index gets: the sdist and the wheel built from
the tree as it would be committed (``python -m build``: the wheel from the sdist, so a
file the sdist forgets is missing from both), the wheel installed into a fresh venv, and
from there ``elastic-run --version`` and a one-worker job of the README's example, run
from the unpacked sdist, away from this checkout. And ``python setup.py --version``,
for the tools that still ask a ``setup.py``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.integration

VERSION = re.findall(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[0]


def run(argv: list[str], cwd: Path, timeout: float, env: dict | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def clean_tree(target: Path) -> Path:
    """The files git tracks, and those it does not ignore, as they are now."""
    listed = run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], ROOT, 30)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def test_setup_py_answers_from_pyproject():
    assert run([sys.executable, "setup.py", "--version"], ROOT, 60).strip() == VERSION


@pytest.mark.timeout(420)
def test_the_wheel_from_the_sdist_installs_and_runs_a_job(tmp_path):
    tree = clean_tree(tmp_path / "tree")
    dist = tmp_path / "dist"
    # --no-isolation: the build uses this venv's setuptools (pyproject's build
    # requirement), with no download of its own.
    run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(tree)],
        tree,
        300,
    )
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    assert VERSION in sdist.name and VERSION in wheel.name

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path, 120)
    run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], tmp_path, 300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    assert run(["elastic-run", "--version"], tmp_path, 60, env).strip().endswith(VERSION)

    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    example = unpacked / "examples" / "train_digits.py"
    assert (unpacked / "examples" / "data" / "digits.csv.gz").is_file()
    job = tmp_path / "job"
    job.mkdir()  # away from any checkout: only the installed packages can be imported
    out = run(["elastic-run", "-np", "1", "python", str(example)], job, 180, env)
    assert "target 0.95" in out, out  # it trained, and reached the example's target
