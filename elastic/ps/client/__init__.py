"""The worker's side of the parameter servers: ``PSClient`` and ``connect``."""

from __future__ import annotations

from elastic.ps.client.client import PSClient, connect

__all__ = ["PSClient", "connect"]
