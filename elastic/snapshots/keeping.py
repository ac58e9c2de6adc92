"""Whose each snapshot in a checkpoint folder is, and which of them a job may load,
prune, or delete to make room on a full disk (pure: ``files`` lists and deletes).

A snapshot is tagged with its job (its id in the manifest, a digest of it in the
folder's name) and with the structure of its state (``structure``). For a job:

* ``MINE``: its own job's, of a structure that fits its state: loaded, pruned, deleted
  for room;
* ``OTHER_STATE``: its own job's, of a structure that does not fit (the script's state
  changed): refused loudly when offered, never deleted (kept, for a person);
* ``OTHER_JOB``: another job's: never loaded, never deleted, whatever its step;
* ``LEGACY``: written by an older version, with no tags: the folder's, so loaded when
  the values read fit the state, and deleted only once this job keeps snapshots of its
  own above it (one at a higher step may be of another state: it is kept).

A torn folder (no manifest) is said by its name: its job's digest, or none (legacy).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

from elastic.snapshots.structure import Structure, differences

MINE, OTHER_STATE, OTHER_JOB, LEGACY = "mine", "other-state", "other-job", "legacy"


def job_tag(job_id: str) -> str:
    """The part of a snapshot folder's name that says its job (any id: a fixed length,
    file-name safe)."""
    return "j" + hashlib.sha256(job_id.encode()).hexdigest()[:10]


def loadable(job_id: str, structure: Structure | None, our_job: str) -> bool:
    """Whether a snapshot of job ``job_id`` (``structure`` None: legacy) may be offered
    to job ``our_job`` at all: its own, or a legacy one (its structure is checked when
    it is loaded)."""
    return structure is None or job_id == our_job


def whose(job_id: str, structure: Structure | None, our_job: str, ours: Structure) -> str:
    """Whose the complete snapshot of job ``job_id`` and ``structure`` (None: legacy)
    is, for job ``our_job`` whose state is of structure ``ours``."""
    if structure is None:
        return LEGACY
    if job_id != our_job:
        return OTHER_JOB
    return OTHER_STATE if differences(structure, ours) else MINE


def whose_folder(path: str, our_job: str) -> str:
    """Whose the torn snapshot folder ``path`` is, by its name (``files.folder``)."""
    last = os.path.basename(path).rsplit("-", 1)[-1]
    if not (len(last) == len(job_tag("")) and last.startswith("j")):
        return LEGACY
    return MINE if last == job_tag(our_job) else OTHER_JOB


@dataclass(frozen=True)
class Snapshot:
    """A snapshot folder as the choice sees it: ``written`` is 0 for a torn one."""

    path: str
    step: int
    written: float
    whose: str


@dataclass(frozen=True)
class Found:
    """The snapshot folders of one root: complete ones and torn ones."""

    complete: tuple[Snapshot, ...]
    torn: tuple[Snapshot, ...]


def _newest_first(snapshots: Sequence[Snapshot]) -> list[Snapshot]:
    return sorted(snapshots, key=lambda s: (s.step, s.written), reverse=True)


def _of(found: Found, whose: str) -> list[Snapshot]:
    return _newest_first([s for s in found.complete if s.whose == whose])


def to_prune(found: Found, keep: int, written: int) -> list[str]:
    """The folders a job prunes once its snapshot of commit ``written`` is complete:
    its own complete snapshots beyond the ``keep`` newest; legacy ones below the oldest
    of those ``keep`` (once it has that many); its own and legacy torn folders of
    commits before ``written`` (a newer one may still be being written)."""
    mine = _of(found, MINE)
    gone = [s.path for s in mine[keep:]]
    if len(mine) >= keep:
        floor = mine[keep - 1].step
        gone += [s.path for s in _of(found, LEGACY) if s.step < floor]
    gone += [s.path for s in found.torn if s.whose in (MINE, LEGACY) and s.step < written]
    return gone


def room(found: Found, step: int) -> list[str]:
    """The folders a job may delete, in this order, to make room on a full disk for its
    snapshot of commit ``step``: its own and legacy torn folders of earlier commits
    (oldest first), then its own complete snapshots and the legacy ones below its newest,
    oldest first; never the newest complete one it could resume from (its own newest,
    else the newest legacy one), nor another job's or another state's."""
    torn = sorted(
        (s for s in found.torn if s.whose in (MINE, LEGACY) and s.step < step),
        key=lambda s: s.step,
    )
    mine, legacy = _of(found, MINE), _of(found, LEGACY)
    # What stands is the newest this job could resume from: its own, else a legacy one.
    older = mine[1:] + [s for s in legacy if s.step < mine[0].step] if mine else legacy[1:]
    return [s.path for s in torn] + [s.path for s in reversed(_newest_first(older))]
