"""The project's version, from its one source: ``version`` in ``pyproject.toml``.

A source checkout (an editable install, or the tree on ``PYTHONPATH``, as the tests
run it) reads the file itself, so a version bumped there shows without reinstalling;
an installed wheel has no ``pyproject.toml`` beside its packages and reads the package
metadata that was built from it. ``elastic.__version__`` and ``elastic-run --version``
both come from here.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from pathlib import Path

DISTRIBUTION = "elastic-training"
"""The name ``pyproject.toml`` gives the distribution (``[project] name``)."""

_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
# ``name = "..."`` and ``version = "..."`` lines of the [project] table.
_NAME_LINE = re.compile(r'^name\s*=\s*"([^"]+)"\s*$', re.MULTILINE)
_VERSION_LINE = re.compile(r'^version\s*=\s*"([^"]+)"\s*$', re.MULTILINE)


@functools.cache
def package_version() -> str:
    """The version (``"0+unknown"`` when neither the file nor the metadata has one)."""
    try:
        text = _PYPROJECT.read_text(encoding="utf-8")
    except OSError:
        text = ""
    project = text.partition("[project]")[2].split("\n[", 1)[0]
    name, found = _NAME_LINE.search(project), _VERSION_LINE.search(project)
    if name and name.group(1) == DISTRIBUTION and found:  # our file, not a neighbour's
        return found.group(1)
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"
