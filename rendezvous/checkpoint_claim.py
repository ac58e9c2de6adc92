"""A driver's hold on its checkpoint folder (``FolderClaim``): the lock taken, the owner
record read, the decision applied (``rendezvous.checkpoint_owner.decide``), the record
written and refreshed for as long as the driver runs.

Two files in the folder: ``.elastic-owner.lock``, never replaced (an ``flock`` on it is
held by the driver for its whole life: the kernel drops it with the process), and
``.elastic-owner.json``, the record, replaced whole (a temporary file, fsync, rename)
and read only as a private file (``rendezvous.private_dir``: this user's, no link).
The record's age is measured on the file system's own clock: against the time of the
temporary file just written there, so two hosts' clocks never compare.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable

from rendezvous.checkpoint_owner import (
    BUSY,
    HELD,
    NO_LOCKS,
    REFRESH,
    REFUSE,
    SHARE,
    Claimant,
    OwnerRecord,
    Seen,
    Verdict,
    decide,
)
from rendezvous.errors import RendezvousConfigError
from rendezvous.private_dir import PrivateFileError, open_private_file

log = logging.getLogger(__name__)

RECORD = ".elastic-owner.json"
LOCK = ".elastic-owner.lock"
RECORD_LIMIT = 64 << 10  # a record is ~150 bytes: a larger file is not one


class CheckpointDirInUseError(RendezvousConfigError):
    """The checkpoint folder belongs to another job whose driver lives (or to a live
    driver of this job that cannot share it), or its owner record cannot be read; the
    message is one line naming the folder and the holder."""


def _take_lock(fd: int) -> str:
    """``HELD``, ``BUSY`` (another open of the lock file holds it), or ``NO_LOCKS`` (this
    file system takes none)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return BUSY
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return NO_LOCKS
        raise
    return HELD


def _read_record(directory: str, flag: str) -> tuple[OwnerRecord | None, float]:
    """The folder's record (None: there is none) and its time (mtime).

    Raises:
        CheckpointDirInUseError: a record is there but is not to be trusted or read."""
    path = os.path.join(directory, RECORD)
    if not os.path.lexists(path):
        return None, 0.0
    try:
        with open_private_file(path, directory, RECORD_LIMIT) as f:
            data = bytes(f.read(f.size))
        return OwnerRecord.from_json(data), os.stat(path, follow_symlinks=False).st_mtime
    except (PrivateFileError, ValueError, OSError) as exc:
        raise CheckpointDirInUseError(
            f"{flag} {directory}: its owner record {path} is not usable ({exc}); "
            "remove it if no job uses this folder"
        ) from None


def _write_temporary(directory: str, record: OwnerRecord) -> tuple[str, float]:
    """``record`` written and fsynced to a temporary file in ``directory``; its path and
    time (the file system's "now"). Raises OSError."""
    tmp = os.path.join(directory, f"{RECORD}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, record.to_json())
        os.fsync(fd)
        return tmp, os.fstat(fd).st_mtime
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _fsync_folder(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FolderClaim:
    """This driver's hold on a checkpoint folder (``claim``): the lock file open (and
    locked while it holds the folder), the record refreshed every ``refresh`` s by a
    daemon thread. A driver that shares the folder with a live driver of its own job
    waits for the lock in that thread and takes the folder when it is free. ``close``
    lets it go (so does the process's end)."""

    def __init__(self, directory: str, record: OwnerRecord, fd: int, refresh: float):
        self.directory, self.record = directory, record
        self._fd, self._refresh = fd, refresh
        self._closed = threading.Event()
        self._path = os.path.join(directory, RECORD)
        self._inode: int | None = None  # the record file this driver wrote
        self._thread: threading.Thread | None = None

    @classmethod
    def claim(
        cls,
        directory: str,
        me: Claimant,
        refresh: float = REFRESH,
        pid: int | None = None,
        now: Callable[[], float] | None = None,
    ) -> tuple[FolderClaim, Verdict]:
        """Take (or share) ``directory`` for driver ``me`` (``pid``: its pid, this
        process's by default); the hold and the decision.

        Raises:
            CheckpointDirInUseError: the folder is another live job's, a live driver of
                this job holds it and may not share it, or its record cannot be read.
            OSError: the lock file or the record cannot be written.
        """
        clock = now or time.time
        fd = os.open(
            os.path.join(directory, LOCK),
            os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        try:
            lock = _take_lock(fd)
            record, refreshed = _read_record(directory, me.flag)
            mine = OwnerRecord(me.job_id, me.host, pid or os.getpid(), clock())
            tmp, fs_now = _write_temporary(directory, mine)
            try:
                seen = Seen(record, max(fs_now - refreshed, 0.0), lock)
                verdict = decide(directory, seen, me)
                if verdict.action == REFUSE:
                    raise CheckpointDirInUseError(verdict.why)
                if verdict.job_id != mine.job_id:  # the folder's job: written again as it
                    mine = OwnerRecord(verdict.job_id, mine.host, mine.pid, mine.since)
                    os.unlink(tmp)
                    tmp, _ = _write_temporary(directory, mine)
                hold = cls(directory, mine, fd, refresh)
                if verdict.action == SHARE:
                    hold._start(hold._wait_then_hold)
                else:
                    hold._write(tmp)
                    tmp = ""
                    hold._start(hold._keep_fresh)
            finally:
                if tmp:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
        except BaseException:
            os.close(fd)
            raise
        return hold, verdict

    def _write(self, tmp: str | None = None) -> None:
        """Make this driver's record (already written to ``tmp``, when given) the
        folder's, atomically. Raises OSError."""
        if tmp is None:
            tmp, _ = _write_temporary(self.directory, self.record)
        os.replace(tmp, self._path)
        _fsync_folder(self.directory)
        self._inode = os.stat(self._path, follow_symlinks=False).st_ino

    def _start(self, target: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=target, name="elastic-checkpoint-owner", daemon=True)
        self._thread.start()

    def _keep_fresh(self) -> None:
        """Refresh the record's time while this driver holds the folder, so that a
        driver on another host sees it alive; stop once another driver's record
        replaced it (a successor of this job)."""
        while not self._closed.wait(self._refresh):
            try:
                if os.stat(self._path, follow_symlinks=False).st_ino != self._inode:
                    return
                os.utime(self._path)  # the file system's time, not this host's
            except OSError as exc:
                log.warning("cannot refresh %s: %s", self._path, exc.strerror or exc)

    def _wait_then_hold(self) -> None:
        """A driver of this job holds the folder: take it once that driver is gone."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError:
            return  # closed, or no locks here: the holder refreshes the record
        if self._closed.is_set():
            return
        try:
            self._write()
        except OSError as exc:
            log.warning("cannot write %s: %s", self._path, exc.strerror or exc)
            return
        self._keep_fresh()

    def close(self) -> None:
        """Let the folder go: the lock is dropped, the record stays (the folder is the
        job's: the same job started again takes it back)."""
        self._closed.set()
        with contextlib.suppress(OSError):
            os.close(self._fd)
