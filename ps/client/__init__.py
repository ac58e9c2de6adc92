"""The worker's side of the parameter servers: ``PSClient`` and ``connect``."""

from __future__ import annotations

from ps.client.client import PSClient
from ps.client.connect import connect

__all__ = ["PSClient", "connect"]
