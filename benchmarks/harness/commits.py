"""The workers' commit logs: what the workloads append, read as it grows."""

from __future__ import annotations

import glob
import json
from collections import defaultdict
from pathlib import Path


class CommitLog:
    """Follows the ``*.commits`` files the workloads write in one directory.

    ``poll()`` reads what was appended since the last call (whole lines only: a line a
    SIGKILLed worker tore is left unread). Records are kept per file stem (the worker
    id for ours, ``torch-g<restart>-rank<r>-<host>-<pid>`` for torchrun). A commit's
    round is its ``round_field``: ``round`` (ours' round, torchrun's restart count on
    one node) or ``group`` (the id a torchrun worker group agrees on, across nodes)."""

    def __init__(self, directory: Path, round_field: str = "round"):
        self.directory = Path(directory)
        self.round_field = round_field
        self._offsets: dict[str, int] = {}
        self.records: dict[str, list[dict]] = defaultdict(list)
        self.max_round: float = 0

    def poll(self) -> CommitLog:
        for path in glob.glob(str(self.directory / "*.commits")):
            key = Path(path).stem
            offset = self._offsets.get(key, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            end = data.rfind(b"\n") + 1
            for line in data[:end].splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                self.records[key].append(rec)
                if rec["ev"] == "commit":
                    self.max_round = max(self.max_round, rec[self.round_field])
            self._offsets[key] = offset + end
        return self

    def commits(self, key: str):
        return (r for r in self.records.get(key, ()) if r["ev"] == "commit")

    def count_in_round(self, key: str, round_id: float) -> int:
        return sum(1 for r in self.commits(key) if r[self.round_field] == round_id)

    def first_commit_after(self, key: str, round_id: float, t0: float, size: int | None = None):
        """The time of ``key``'s first commit in a round newer than ``round_id`` logged
        after ``t0`` (and, if given, in a round of ``size``); None if none yet."""
        for r in self.commits(key):
            newer = r[self.round_field] > round_id
            if newer and r["t"] >= t0 and (size is None or r["size"] == size):
                return r["t"]
        return None

    def event(self, key: str, ev: str):
        return next((r for r in self.records.get(key, ()) if r["ev"] == ev), None)

    def steady_round(self, size: int, settle: int) -> tuple[float, list[str]] | None:
        """(round, its workers' keys) once the newest round (by ``round_field``) has
        ``size`` workers, each with ``settle`` commits in it; else None (reads first)."""
        self.poll()
        rounds: dict[float, dict[str, int]] = {}
        for key in self.records:
            for r in self.commits(key):
                members = rounds.setdefault(r[self.round_field], {})
                members[key] = members.get(key, 0) + 1
        if not rounds:
            return None
        members = rounds[max(rounds)]
        if len(members) == size and min(members.values()) >= settle:
            return max(rounds), sorted(members)
        return None
