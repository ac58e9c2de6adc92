"""Where things are, for the tests and their helpers (one place)."""

from __future__ import annotations

from pathlib import Path

#: the repository's root (the project's packages and examples/ are there)
ROOT = Path(__file__).resolve().parent.parent.parent
#: the scripts the tests run as workers
WORKLOADS = Path(__file__).resolve().parent / "workloads"
