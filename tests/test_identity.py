"""The project's identity: one version (pyproject.toml's) behind ``elastic.__version__``
and ``elastic-run --version``, and console scripts that point at real entry points."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys

import elastic
from rendezvous.version import package_version
from tests.jobs import ROOT

# Read plainly (tomllib is 3.11+; the package supports 3.9).
_TEXT = (ROOT / "pyproject.toml").read_text()
_SCRIPTS = _TEXT.split("\n[project.scripts]\n", 1)[1].split("\n[", 1)[0]
VERSION = re.search(r'^version = "([^"]+)"$', _TEXT, re.MULTILINE).group(1)  # type: ignore[union-attr]
SCRIPTS = dict(re.findall(r'^([\w-]+) = "([\w.]+:\w+)"$', _SCRIPTS, re.MULTILINE))


def test_one_version_from_pyproject():
    assert elastic.__version__ == package_version() == VERSION
    assert "__version__" not in elastic.__dict__  # read when asked, not at import


def test_elastic_run_version():
    done = subprocess.run(
        [sys.executable, "-m", "driver.cli", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0
    assert done.stdout.strip() == f"elastic-run {VERSION}"


def test_console_scripts_point_at_working_entry_points():
    assert SCRIPTS == {"elastic-run": "driver.cli:main", "elastic-plot": "runplot.__main__:main"}
    for name, target in SCRIPTS.items():
        module_name, _, function = target.partition(":")
        main = getattr(importlib.import_module(module_name), function)
        # What the installed script runs: main() with the arguments after its name.
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys; from {module_name} import {function}; "
                f"sys.exit({function}(['--help']))",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert callable(main) and done.returncode == 0, (name, done.stderr)
        assert "usage:" in done.stdout, name
