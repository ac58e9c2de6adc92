"""A process's snapshots (``Snapshotter``): the commit hook, the writer thread, what a
member offers and loads when a round syncs, and the snapshot a round asks for.

* **Periodic.** Rank 0 asks for a snapshot of a commit a little ahead
  (``schedule.ask``); when a member makes that commit, the state hands over its
  committed copy (``_snapshot_payload``: no copy on the training thread) and a writer
  thread of this process writes this member's part of it: the arrays are cut into as
  many parts as there are writers (``parts.cut``), so a large state is written by
  every member at once. The writer of part 0 also writes the skeleton, waits for the
  other parts (``coordination``), writes the manifest and prunes the oldest.
* **Where.** Every member of a round writes into one folder when every member sees the
  files every other one writes (a shared file system: the check is a probe file per
  host at each round's sync); otherwise each host writes a whole copy into its own
  folder (``host-<label>``), cut among the members on that host. A round on one host
  writes into the directory itself, but tells the driver that only that host is known
  to read it (no other host checked).
* **Sync.** When a round syncs, each member offers its live commit and the newest
  complete snapshot of this job it can read (another job's is never offered:
  ``keeping``); the newest of all wins (``schedule.choose_source``). When that is a
  snapshot, its holder loads it (every checksum checked, and its structure against the
  state's: a torn or corrupt one, or one of another state, is said, and every member
  skips it for the one before) and broadcasts it as a live commit would be.
* **A full disk.** A file of a snapshot the disk refuses for want of space is written
  once more after the oldest of this job's snapshots made room (``files.make_room``:
  never the newest complete one); when that fails too, the snapshot is abandoned.
* **While the store is away.** Its writers cannot agree through a store that does not
  answer (an etcd that stalls: the ring trains on), so while rank 0's writes to it
  have gone unanswered for ``ALONE_AFTER`` seconds (``store_away``), rank 0 writes
  the periodic snapshots alone, every part of the replicated state itself, and
  completes them without the others; what it would tell the driver is told when the
  store answers, if it does. A job ended by a long outage (``--elastic-timeout``)
  thus keeps a snapshot at most one interval old.
* **On request.** A round the driver publishes with a snapshot to take
  (``Plan.snapshot``: a stop, or a host about to go) makes every member write its part
  of the commit they just synced, and wait until it is durable.

Nothing here raises into training: a snapshot that cannot be written (a full disk, a
member that died) is abandoned, said to the driver, and the previous one stays whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from elastic.errors import SnapshotError, SnapshotStructureError
from elastic.snapshots import codec, files, keeping, parts, schedule
from elastic.snapshots.coordination import Coordination
from elastic.snapshots.settings import SnapshotSettings
from elastic.snapshots.structure import Structure, describe, differences, summary
from elastic.thread_priority import lower_this_thread
from rendezvous import disk_room
from rendezvous.keys import JobKeys
from rendezvous.schema.rounds import SNAPSHOT_FINAL
from rendezvous.schema.snapshots import SnapshotAt, SnapshotPart, SnapshotRecord

log = logging.getLogger(__name__)

ALL = "all"
"""The group of a snapshot every member writes into one folder."""

PROBES = ".probes"
# How long a closing process waits for the snapshots it has in flight (a periodic one the
# training's end overtook, most often): its peers are writing their parts of the same
# commit, so it completes in a moment, and a thread left running at the interpreter's
# exit can abort it (torch's threads). A peer that is gone makes it wait this long, no more.
CLOSE_WAIT = 3.0
ALONE_AFTER = 3.0
"""Seconds the store has not taken rank 0's writes after which rank 0 snapshots alone
(longer than a slow answer, ``rendezvous.store_reach.SLOW_ANSWER``: a blip does not
make the members' parts one writer's)."""


@dataclass(frozen=True)
class Round:
    """What a snapshot needs of the round this process is in: its id, this member's
    rank among ``size`` and among the ``local_size`` members of its ``host``, and what
    the round's plan asks (``Plan.snapshot``)."""

    round_id: int
    rank: int
    size: int
    local_rank: int
    local_size: int
    host: str
    asks: str = ""
    token: str = ""  # the name of the snapshot the plan asks for (``Plan.snapshot_token``)


@dataclass(frozen=True)
class Layout:
    """Who writes which part of a round's snapshots, and where: ``group`` (``ALL``, or
    the host's label), its ``root`` folder, this writer's part ``index`` of ``parts``."""

    group: str
    root: str
    index: int
    parts: int
    host: str = ""  # the host whose disk holds the group's snapshots ("": every member's)


class SnapshotState(Protocol):
    """What a ``State`` gives its snapshots (underscored: a state's public names are the
    user's attributes)."""

    _commits: int

    def _snapshot_payload(self) -> Any: ...

    def _snapshot_returned(self, payload: Any) -> None: ...

    def _snapshot_values(self) -> Any: ...

    def _load_snapshot(self, values: Any, commits: int) -> None: ...

    def _broadcast_from(self, root: int) -> None: ...


class SyncWorld(Protocol):
    """The collectives a round's sync uses."""

    def size(self) -> int: ...

    def allgather_object(self, obj: Any) -> list: ...

    def broadcast_object(self, obj: Any = None, root: int = 0) -> Any: ...


class RequestedSnapshot(NamedTuple):
    """What ``Snapshotter.take_requested`` did: ``stop``, the plan asks the workers to
    stop after it; ``error``, why this worker's part (or the snapshot) was not written
    (None: it is durable)."""

    stop: bool
    error: str | None


@dataclass
class _Job:
    """One part to write: ``payload`` (a state's committed values) of commit ``step``."""

    state: SnapshotState
    payload: Any
    at: SnapshotAt
    layout: Layout
    asked: float  # when the commit was made (monotonic)
    final: bool = False
    alone: bool = False  # every part written here, completed without the others
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: str | None = None  # why this part, or the snapshot, was not written


class Snapshotter:
    """The snapshots of this process's state (see the module docstring).

    ``round_info()``: the round this process is in (None before its first);
    ``superseded(round_id)``: whether a newer round came (or the process is closing);
    ``coordination``: how it agrees with the other writers; ``keys``: the job's (its id
    is recorded in each manifest); ``store_away()``: for how long the store has not
    taken this process's writes (0.0 while it does); ``clock``: monotonic time.
    """

    def __init__(
        self,
        settings: SnapshotSettings,
        coordination: Coordination,
        round_info: Callable[[], Round | None],
        superseded: Callable[[int], bool],
        keys: JobKeys,
        store_away: Callable[[], float] = lambda: 0.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.settings = settings
        self._store_away = store_away
        self._coordination = coordination
        self._round_info = round_info
        self._superseded = superseded
        self._keys = keys
        self._clock = clock
        self._lock = threading.Lock()
        self._layout: Layout | None = None
        self._timer = schedule.StepTimer()
        self._since: float | None = None  # the last snapshot (monotonic), or the first round
        self._asked: tuple[int, int] | None = None  # (round, step) this process asked for
        self._handled: set[tuple[int, int]] = set()  # (round, step) captured or missed
        self._unreadable: set[str] = set()  # folders that failed to load
        self._foreign: set[tuple[str, str]] = set()  # (root, job id) of others' said
        self._disabled = ""  # why this state cannot be snapshotted ("" while it can)
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._finishers: list[threading.Thread] = []  # part 0's, waiting for the others
        self._writer = threading.Thread(
            target=self._write_jobs, name="elastic-snapshots", daemon=True
        )
        self._writer.start()

    # ------------------------------------------------------------------ the training thread
    def on_commit(self, state: SnapshotState, commits: int) -> None:
        """The state committed ``commits`` commits: ask for a snapshot when one is due
        (rank 0), and hand over the committed copy when this commit is the one asked
        for. Cheap; never raises."""
        now, where = self._clock(), self._round_info()
        layout = self._layout
        if where is None or layout is None or self._disabled:
            return
        self._timer = self._timer.observe(commits, now)
        since = self._since if self._since is not None else now
        alone = self._coordination.alone or (where.rank == 0 and self._store_away() > ALONE_AFTER)
        if alone:
            if now >= since + self.settings.interval:
                now_at = SnapshotAt(where.round_id, commits, _token())
                self._capture(state, now_at, dataclasses.replace(layout, index=0, parts=1), now)
            return
        if where.rank == 0 and (
            self._asked is None or self._asked[0] != where.round_id or self._asked[1] < commits
        ):
            step = schedule.ask(
                commits,
                now,
                since,
                self._timer.seconds,
                self.settings.interval,
                self.settings.ask_ahead,
            )
            if step is not None:
                self._asked = (where.round_id, step)
                self._coordination.ask(SnapshotAt(where.round_id, step, _token()))
        at = self._coordination.target()
        if at is None or at.round_id != where.round_id or (at.round_id, at.step) in self._handled:
            return
        if at.step == commits:
            self._capture(state, at, layout, now)
        elif at.step < commits:
            # Heard of it too late (the store was slow): the snapshot cannot be whole.
            self._handled.add((at.round_id, at.step))
            missed = SnapshotPart(layout.index, error=f"commit {at.step} was past when asked")
            self._coordination.part_written(layout.group, at, missed)

    def _capture(
        self, state: SnapshotState, at: SnapshotAt, layout: Layout, now: float, final: bool = False
    ) -> _Job | None:
        self._handled.add((at.round_id, at.step))
        self._since = now
        try:
            payload = state._snapshot_payload()
        except NotImplementedError:
            self._disabled = f"{type(state).__name__} does not say what to snapshot"
            log.warning("snapshots are off: %s", self._disabled)
            return None
        job = _Job(state, payload, at, layout, now, final, alone=layout.parts == 1)
        self._jobs.put(job)
        return job

    # ------------------------------------------------------------------ a round's sync
    def adopt_newest(self, state: SnapshotState, world: SyncWorld, rank: int) -> int:
        """The sync of a round (collective): the newest state any member holds, a live
        commit or a snapshot, becomes every member's. Returns its commit count.

        Raises:
            WorkerLostError: the round breaks meanwhile.
        """
        where = self._round_info()
        size = world.size()
        probe = self._write_probe(where)
        offered = self._readable()
        while True:
            mine = (state._commits, offered[0].step if offered else 0, where.host if where else "")
            everyone = world.allgather_object(mine) if size > 1 else [mine]
            source = schedule.choose_source([(c, s) for c, s, _ in everyone])
            if source.snapshot:
                failed: str | None = None  # the folder that did not load (None: it did)
                mine_fails = rank == source.rank and (
                    offered is None or not self._load(state, offered[1], offered[0], where)
                )
                if mine_fails:
                    failed = offered[1] if offered is not None else ""
                if size > 1:
                    failed = world.broadcast_object(failed, root=source.rank)
                if failed is not None:
                    # Every member skips it: in a shared folder it is everyone's newest,
                    # and each would otherwise read the whole of it to find the same fault.
                    self._unreadable.add(failed)
                    offered = self._readable()
                    continue
            if size > 1:
                state._broadcast_from(source.rank)
            break
        self._layout = self._decide_layout(world, where, {h for _, _, h in everyone}, probe)
        if self._since is None:
            self._since = self._clock()
        return source.step

    def _readable(self) -> tuple[files.Manifest, str] | None:
        """The newest complete snapshot of this job this member can read (not one that
        failed); another job's are said once per root and job, and never offered."""
        found = []
        for root in files.roots(self.settings.directory):
            for manifest, path in files.complete(root):
                if not keeping.loadable(manifest.job_id, manifest.structure, self._keys.job_id):
                    self._say_foreign(root, manifest.job_id)
                elif path not in self._unreadable:
                    found.append((manifest, path))
        found.sort(key=lambda item: (item[0].step, item[0].written), reverse=True)
        return found[0] if found else None

    def _say_foreign(self, root: str, job_id: str) -> None:
        if (root, job_id) not in self._foreign:
            self._foreign.add((root, job_id))
            log.warning(
                "the snapshots of job %s in %s are not this job's (%s): never loaded nor "
                "deleted by it",
                job_id,
                root,
                self._keys.job_id,
            )

    def _load(
        self, state: SnapshotState, path: str, manifest: files.Manifest, where: Round | None
    ) -> bool:
        """Load the snapshot in ``path`` into ``state``; False (said to the driver) when a
        file of it is torn or corrupt, its structure is not the state's (checked before
        a byte of it is read; a legacy one's on the values read), or its values do not
        load (the state then holds what it held)."""
        host = where.host if where else ""  # a host that reads it, at least
        try:
            ours = _structure_of(state)
            if manifest.structure is not None and ours is not None:
                _check_fits(path, manifest.structure, ours)
            skeleton, buffers = files.read(path, manifest, parts.cut)
            values = codec.join(
                skeleton,
                [leaf.kind for leaf in manifest.leaves],
                [leaf.meta for leaf in manifest.leaves],
                buffers,
            )
            if manifest.structure is None and ours is not None:
                _check_fits(path, describe(values), ours)
            state._load_snapshot(values, manifest.step)
        except SnapshotStructureError as exc:
            # Not corrupt (kept as it is, for the script it belongs to), and said as
            # what it is: another state than this script's, refused.
            why = str(exc)
            log.warning("%s; trying the one before", why)
            record = SnapshotRecord(manifest.step, manifest.round_id, path, host=host, error=why)
            self._coordination.say(self._keys.snapshot_failed(ALL), record)
            return False
        except Exception as exc:  # noqa: BLE001  (anything a snapshot's bytes can cause)
            why = str(exc) if isinstance(exc, SnapshotError) else f"it does not load: {exc!r}"
            moved = files.set_aside(path) if isinstance(exc, SnapshotError) else None
            log.warning(
                "snapshot of commit %d is unusable, trying the one before: %s%s",
                manifest.step,
                why,
                f" (set aside as {moved})" if moved else "",
            )
            record = SnapshotRecord(manifest.step, manifest.round_id, path, host=host, error=why)
            self._coordination.say(self._keys.snapshot_failed(ALL), record)
            return False
        round_id = where.round_id if where else 0
        log.warning("resumed from the snapshot of commit %d in %s", manifest.step, path)
        record = SnapshotRecord(manifest.step, round_id, path, host=host, bytes=manifest.nbytes)
        self._coordination.say(self._keys.snapshot_loaded(round_id), record)
        return True

    def _write_probe(self, where: Round | None) -> str:
        """A file that tells the members of this round whether they share the checkpoint
        directory (``_decide_layout`` looks for every host's)."""
        if where is None:
            return ""
        folder = os.path.join(self.settings.directory, PROBES)
        path = os.path.join(folder, _probe_name(self._keys.job_id, where.round_id, where.host))
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            with open(path, "w") as f:
                f.write(where.host)
        except OSError as exc:
            log.warning(
                "cannot write in the checkpoint directory %s: %s", self.settings.directory, exc
            )
            return ""
        return path

    def _decide_layout(
        self, world: SyncWorld, where: Round | None, hosts: set[str], probe: str
    ) -> Layout:
        """One folder for every member when each sees every host's probe; else a folder
        per host (collective when the round has several members). On one host the
        directory itself, said to be that host's: whether others see it is unknown."""
        if where is None:
            where = Round(0, 0, 1, 0, 1, "")
        folder = os.path.join(self.settings.directory, PROBES)
        sees_all = all(
            os.path.exists(os.path.join(folder, _probe_name(self._keys.job_id, where.round_id, h)))
            for h in hosts
        )
        shared = all(world.allgather_object(sees_all)) if world.size() > 1 else sees_all
        if probe:
            with contextlib.suppress(OSError):  # another member of this host removed it first
                os.unlink(probe)
        if shared:
            known_to = "" if len(hosts) > 1 else where.host
            return Layout(ALL, self.settings.directory, where.rank, where.size, host=known_to)
        root = os.path.join(self.settings.directory, files.HOST_PREFIX + _safe(where.host))
        return Layout(where.host, root, where.local_rank, where.local_size, host=where.host)

    # ------------------------------------------------------------------ on request
    def take_requested(self, state: SnapshotState) -> RequestedSnapshot:
        """When the round's plan asks for a snapshot (right after its sync), write this
        member's part of the commit every member now holds and wait until it is
        durable (and, for the part 0 writer, the whole snapshot). Says whether the plan
        asks the workers to stop after it, and whether this worker's part was written
        (or why not)."""
        where, layout = self._round_info(), self._layout
        stop = bool(where and where.asks == SNAPSHOT_FINAL)
        if where is None or not where.asks or layout is None or self._disabled:
            why = f"snapshots are off: {self._disabled}" if self._disabled else "none was taken"
            return RequestedSnapshot(stop, why)
        at = SnapshotAt(where.round_id, state._commits, where.token or f"r{where.round_id}")
        job = self._capture(state, at, layout, self._clock(), final=stop)
        if job is None:
            return RequestedSnapshot(stop, f"snapshots are off: {self._disabled}")
        if not job.done.wait(self.settings.part_deadline + 10.0):
            log.warning("the requested snapshot of commit %d did not finish in time", at.step)
            return RequestedSnapshot(stop, f"the snapshot of commit {at.step} did not finish")
        return RequestedSnapshot(stop, job.error)

    # ------------------------------------------------------------------ the writer thread
    def _write_jobs(self) -> None:
        # Hashing and copying a part take CPU the training threads would use: this
        # thread (and the finishing threads it starts) takes what they leave.
        lower_this_thread()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._write(job)
            except Exception:  # a bug here must not stop later snapshots (nor training)
                log.exception("snapshot of commit %d failed", job.at.step)
                job.done.set()

    def _write(self, job: _Job) -> None:
        at, layout = job.at, job.layout
        folder = files.folder(layout.root, at.step, at.token, self._keys.job_id)
        leaves: list[codec.Leaf] = []
        skeleton_entry: files.FileEntry | None = None
        structure = Structure((), ())
        try:
            structure = describe(job.payload)
            skeleton, leaves = codec.split(job.payload)
            room = _Room(layout.root, at.step, len(skeleton) + sum(x.nbytes for x in leaves))
            pieces = parts.cut([leaf.nbytes for leaf in leaves], layout.parts)[layout.index]
            written = self._with_room(
                room,
                structure,
                lambda: files.write_part(folder, layout.index, layout.parts, pieces, leaves),
            )
            if layout.index == 0:
                skeleton_entry = self._with_room(
                    room, structure, lambda: files.write_skeleton(folder, skeleton)
                )
            sizes = _sizes_digest([leaf.nbytes for leaf in leaves])
            part = SnapshotPart(layout.index, written.sha256, written.bytes, leaves=sizes)
        except (OSError, SnapshotError) as exc:
            why = f"{folder}: {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)
            log.warning(
                "cannot write part %d of the snapshot of commit %d: %s", layout.index, at.step, why
            )
            part = SnapshotPart(layout.index, error=why)
            job.error = why
        finally:
            job.state._snapshot_returned(job.payload)
        if not job.alone:
            self._coordination.part_written(layout.group, at, part)
        if layout.index != 0:
            job.done.set()
            return
        entries = tuple(files.LeafEntry(leaf.kind, leaf.meta, leaf.nbytes) for leaf in leaves)
        finisher = threading.Thread(
            target=self._finish,
            args=(job, folder, skeleton_entry, entries, structure, part),
            name="elastic-snapshot-finish",
            daemon=True,
        )
        with self._lock:
            self._finishers = [t for t in self._finishers if t.is_alive()] + [finisher]
        finisher.start()

    def _with_room(self, room: _Room, structure: Structure, write: Callable[[], Any]) -> Any:
        """``write()``; when the disk refuses it for want of space, once more after this
        job's oldest snapshots in the root made room for the whole snapshot (never the
        newest complete one: ``files.make_room``).

        Raises:
            OSError: the second attempt failed too (or the first, for another reason)."""
        try:
            return write()
        except OSError as exc:
            if not disk_room.is_no_space(exc):
                raise
            deleted = files.make_room(
                room.root, room.step, room.needed, self._keys.job_id, structure
            )
            log.warning(
                "the disk of %s is full (%s): %s, and the snapshot of commit %d is written again",
                room.root,
                exc.strerror or exc,
                f"deleted {', '.join(deleted)} to make room" if deleted else "nothing to delete",
                room.step,
            )
        return write()

    def _finish(
        self,
        job: _Job,
        folder: str,
        skeleton: files.FileEntry | None,
        leaves: tuple[files.LeafEntry, ...],
        structure: Structure,
        mine: SnapshotPart,
    ) -> None:
        """Part 0's writer: wait for every part (``mine`` is part 0; a snapshot written
        alone has no other), then write the manifest (the snapshot is complete), prune
        the oldest and say so; or abandon it and say why."""
        at, layout = job.at, job.layout
        try:
            got = (
                (mine.error or [mine])
                if job.alone
                else self._coordination.wait_parts(
                    layout.group,
                    at,
                    layout.parts,
                    self._clock() + self.settings.part_deadline,
                    lambda: self._superseded(at.round_id),
                )
            )
            if isinstance(got, str) or skeleton is None:
                self._abandon(
                    job, folder, got if isinstance(got, str) else "part 0 was not written"
                )
                return
            if len({p.leaves for p in got}) > 1:  # each writer cut its own arrays
                self._abandon(job, folder, "the members' states differ in their arrays' sizes")
                return
            manifest = files.Manifest(
                step=at.step,
                round_id=at.round_id,
                job_id=self._keys.job_id,
                written=files.now(),
                chunk=parts.DEFAULT_CHUNK,
                skeleton=skeleton,
                leaves=leaves,
                parts=tuple(
                    files.FileEntry(files.part_name(p.part, layout.parts), p.bytes, p.sha256)
                    for p in got
                ),
                structure=structure,
            )
            room = _Room(layout.root, at.step, len(manifest.to_json()))
            try:
                self._with_room(room, structure, lambda: files.write_manifest(folder, manifest))
            except OSError as exc:
                self._abandon(job, folder, f"{folder}: {exc.strerror or exc}")
                return
            seconds = round(self._clock() - job.asked, 3)
            record = SnapshotRecord(
                at.step,
                at.round_id,
                folder,
                host=layout.host,
                final=job.final,
                seconds=seconds,
                bytes=manifest.nbytes,
            )
            if job.alone:  # (the store may not answer for long: the snapshot stands now)
                files.prune(layout.root, self.settings.keep, at.step, self._keys.job_id, structure)
                job.done.set()
            self._coordination.say(self._keys.snapshot_done(layout.group), record)
            if not job.alone:  # after: it may be slow
                files.prune(layout.root, self.settings.keep, at.step, self._keys.job_id, structure)
        finally:
            if not job.alone:
                self._coordination.forget_parts(layout.group, at)
            job.done.set()

    def _abandon(self, job: _Job, folder: str, why: str) -> None:
        job.error = why
        files.remove(folder)
        log.warning("snapshot of commit %d abandoned: %s", job.at.step, why)
        record = SnapshotRecord(
            job.at.step, job.at.round_id, folder, host=job.layout.host, final=job.final, error=why
        )
        self._coordination.say(self._keys.snapshot_failed(job.layout.group), record)

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """Stop the writer once the commits handed to it are written, and wait up to
        ``wait`` seconds for the snapshots in flight to complete; those that still
        depend on others then are abandoned (the previous complete one stands)."""
        deadline = time.monotonic() + wait
        self._jobs.put(None)
        self._writer.join(timeout=wait)
        with self._lock:
            finishers = list(self._finishers)
        for finisher in finishers:
            finisher.join(timeout=max(0.0, deadline - time.monotonic()))
        self._coordination.close()
        for finisher in finishers:  # a waiting one sees the close within its 1 s poll
            finisher.join(timeout=2.0)


@dataclass(frozen=True)
class _Room:
    """What a full disk must make room for: the snapshot of commit ``step`` in ``root``,
    ``needed`` bytes (the whole snapshot: every writer of a shared root needs its part)."""

    root: str
    step: int
    needed: int


def _structure_of(state: SnapshotState) -> Structure | None:
    """The structure of ``state``'s last commit (None: the state cannot say, and no
    snapshot's structure is checked against it)."""
    try:
        return describe(state._snapshot_values())
    except NotImplementedError:
        return None


def _check_fits(path: str, snapshot: Structure, state: Structure) -> None:
    """Raises:
    SnapshotStructureError: values of structure ``snapshot`` (the snapshot in ``path``)
        do not fit a state of ``state``'s (one line naming its manifest and what
        differs)."""
    found = differences(snapshot, state)
    if found:
        raise SnapshotStructureError(
            f"snapshot {os.path.join(path, files.MANIFEST)} is refused: it holds another "
            f"state than this script's: {summary(found)}"
        )


def _token() -> str:
    return secrets.token_hex(4)


def _sizes_digest(sizes: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, sizes)).encode()).hexdigest()[:16]


def _safe(name: str) -> str:
    """A host label or job id as part of a file name."""
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in name)


def _probe_name(job_id: str, round_id: int, host: str) -> str:
    return f"{_safe(job_id)}-r{round_id}-{_safe(host)}"
