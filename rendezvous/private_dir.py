"""Directories only the job's user can change (``--checkpoint-dir``, where snapshots go,
and ``--ps-checkpoint-dir``, where ps checkpoints go), and the files in
them that the job may trust.

A directory that another local user created in advance, or can write, is not the job's:
that user could plant files the job then loads as its own (weights, optimizer state, a
pickle that runs code), or rename and delete the job's files. ``check_private_dir``
refuses such a directory with a one-line error that names it and the fix;
``make_private_dir`` creates a missing one readable by its owner only, then checks it
(someone may have made it first). The driver checks ``--ps-checkpoint-dir`` and
``--checkpoint-dir`` before it starts anything, and every shard checks its
``--checkpoint-dir`` again before it reads or writes there.

A private root is not enough for what lies under it: a folder in it may be a symbolic
link to a folder anyone writes, a file may be another user's, a FIFO (whose open waits
for a writer for ever) or a sparse file of any size. ``open_private_file`` is the one
way checkpoint readers open a file: every folder from the root down and the file itself
must be a real folder or regular file (opened with ``O_NOFOLLOW``, never through a
link), owned by this user and not writable by group or others; the file is opened
without blocking and its size checked on the open descriptor before a byte is read.
``PrivateFileError`` says what is wrong in one line naming the path.
"""

from __future__ import annotations

import errno
import io
import os
import pwd
import stat
from typing import Any

from rendezvous.errors import RendezvousConfigError, RendezvousError

CHUNK = 4 << 20
"""Bytes read at a time: a large file is read into its buffer piece by piece, never
through one read of a size the file chose."""


class InsecureDirectoryError(RendezvousConfigError):
    """A directory owned by another user, writable by group or others, or not examinable."""


class PrivateFileError(RendezvousError):
    """A file under a private directory that the job may not read as its own (a link, not
    a regular file, another user's, writable by others, of the wrong size), or that
    cannot be opened or read; the message is one line naming the path."""


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class UnwritableDirectoryError(RendezvousConfigError):
    """A directory the job must write in, where it cannot create a file (read-only,
    immutable, full, or another user's permissions); the message names it and why."""


def probe_writable(path: str, what: str) -> None:
    """Create and remove a file in ``path`` (named ``what`` in the message): the only
    test that holds for root too (``os.access`` says yes to root whatever the folder's
    attributes, and an immutable or read-only-mounted folder refuses it all the same).

    Raises:
        UnwritableDirectoryError: the file cannot be made, written or removed.
    """
    probe = os.path.join(path, f".elastic-probe-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UnwritableDirectoryError(
            f"{what} {path}: cannot write in it ({exc.strerror or exc}): snapshots there "
            "would all fail, and a rerun would start from scratch"
        ) from None


def check_private_dir(path: str, what: str) -> None:
    """Refuse ``path`` (named ``what`` in the message, e.g. the flag that gave it) unless
    it is a directory owned by this process's effective user and not writable by group
    or others; a symbolic link to it must be that user's or root's.

    Raises:
        InsecureDirectoryError: the one-line reason, with the command that fixes it."""
    me = os.geteuid()
    try:
        link = os.lstat(path)
        st = os.stat(path)
    except OSError as exc:
        raise InsecureDirectoryError(f"{what} {path}: cannot examine it: {exc.strerror}") from None
    risk = "another user could plant or rename files in it"
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise InsecureDirectoryError(
            f"{what} {path} is a symbolic link owned by {_user(link.st_uid)}, who can point it "
            f"elsewhere: give the real directory instead"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise InsecureDirectoryError(f"{what} {path} is not a directory")
    if st.st_uid != me:
        raise InsecureDirectoryError(
            f"{what} {path} is owned by {_user(st.st_uid)}, not by this job's user "
            f"{_user(me)}: {risk}; use a directory of your own (or chown {_user(me)} {path})"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        writers = (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH))
        who = " and ".join(name for name, bit in writers if st.st_mode & bit)
        raise InsecureDirectoryError(
            f"{what} {path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}): "
            f"{risk}; chmod go-w {path}"
        )


def make_private_dir(path: str, what: str) -> None:
    """Create ``path`` (and its parents) if missing, the directory itself readable by its
    owner only, then ``check_private_dir`` it.

    Raises:
        InsecureDirectoryError: as ``check_private_dir``, or it cannot be created."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise InsecureDirectoryError(f"{what} {path}: cannot create it: {exc.strerror}") from None
    check_private_dir(path, what)


# ---------------------------------------------------------------- files under a private root
_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISREG, "a regular file"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "of an unknown kind")


def physical_memory() -> int:
    """This machine's memory in bytes: a sane bound on what one load may read (a
    checkpoint or snapshot larger than it cannot be held, whatever its files say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # not on this system: no bound beyond the file's own
        return 1 << 62


def _not_trusted(path: str, st: os.stat_result, want_dir: bool) -> str | None:
    """Why the entry ``st`` (at ``path``) may not be read as this user's own, or None."""
    is_right_kind = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)
    if not is_right_kind:
        wanted = "a real folder" if want_dir else "a regular file"
        return f"{path} is {_kind(st.st_mode)}, not {wanted}"
    me = os.geteuid()
    if st.st_uid != me:
        return (
            f"{path} is owned by {_user(st.st_uid)}, not by this job's user {_user(me)}: "
            f"another user could have planted it"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        writers = (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH))
        who = " and ".join(name for name, bit in writers if st.st_mode & bit)
        return (
            f"{path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}): they could "
            f"have changed it"
        )
    return None


def _open_entry(parent: int, name: str, path: str, want_dir: bool) -> int:
    """Open ``name`` in the folder ``parent`` (a descriptor) as a trusted folder or file.

    Raises:
        PrivateFileError: it is missing, a link, of another kind, or not trusted."""
    # lstat first: a link or a FIFO is described (and a FIFO never opened); the checks
    # that count are made again on the opened descriptor, which nothing can swap.
    try:
        seen = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError as exc:
        raise PrivateFileError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if stat.S_ISLNK(seen.st_mode):
        try:
            target = os.readlink(name, dir_fd=parent)
        except OSError:
            target = "?"
        wanted = "a real folder" if want_dir else "a regular file"
        raise PrivateFileError(f"{path} is a symbolic link to {target}, not {wanted}")
    reason = _not_trusted(path, seen, want_dir)
    if reason is not None:
        raise PrivateFileError(reason)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    # O_NONBLOCK: an open of a FIFO swapped in after the lstat returns at once instead
    # of waiting for a writer; a regular file ignores the flag.
    flags |= os.O_DIRECTORY if want_dir else os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(name, flags, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link or a file
            raise PrivateFileError(f"{path} changed while it was opened: refused") from None
        raise PrivateFileError(f"{path}: cannot open it: {exc.strerror or exc}") from None
    try:
        reason = _not_trusted(path, os.fstat(fd), want_dir)
    except OSError as exc:
        reason = f"{path}: cannot examine it: {exc.strerror or exc}"
    if reason is not None:
        os.close(fd)
        raise PrivateFileError(reason)
    return fd


def _walk(path: str, base: str, want_dir: bool) -> int:
    """A descriptor of ``path``, a folder or a file under the private folder ``base``,
    every folder between them and ``path`` itself checked (``_open_entry``).

    Raises:
        PrivateFileError: ``path`` is not under ``base``, or an entry is not trusted."""
    relative = os.path.relpath(os.path.normpath(path), os.path.normpath(base))
    names = relative.split(os.sep)
    if relative in (os.curdir, "") or os.pardir in names or os.path.isabs(relative):
        raise PrivateFileError(f"{path} is not inside {base}")
    try:
        # The root itself is the user's choice (a link to it is fine), checked with
        # check_private_dir when the job started; everything below is checked here.
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise PrivateFileError(f"{base}: cannot open it: {exc.strerror or exc}") from None
    try:
        for depth, name in enumerate(names):
            last = depth == len(names) - 1
            shown = os.path.join(base, *names[: depth + 1])
            child = _open_entry(fd, name, shown, want_dir or not last)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_private_folder(path: str, base: str) -> None:
    """Refuse the folder ``path`` unless it and every folder between ``base`` (a private
    directory) and it is a real folder (no link) of this user that group and others
    cannot write.

    Raises:
        PrivateFileError: the one-line reason, naming the entry at fault."""
    os.close(_walk(path, base, want_dir=True))


class PrivateFile:
    """A regular file under a private directory, open and checked (``open_private_file``):
    ``size`` is its size on the open descriptor. A context manager."""

    def __init__(self, path: str, fd: int, size: int):
        self.path, self.size = path, size
        self._file = io.FileIO(fd, "rb", closefd=True)

    def readinto(self, view: memoryview, digest: Any = None) -> None:
        """Fill ``view`` from the file's current position, ``CHUNK`` bytes at a time,
        each chunk fed to ``digest.update`` when given.

        Raises:
            PrivateFileError: the file ends first, or a read fails."""
        view = view.cast("B")
        done = 0
        try:
            while done < view.nbytes:
                got = self._file.readinto(view[done : done + CHUNK])
                if not got:
                    raise PrivateFileError(
                        f"{self.path}: ends after {self._file.tell()} bytes, {self.size} expected"
                    )
                if digest is not None:
                    digest.update(view[done : done + got])
                done += got
        except OSError as exc:
            raise PrivateFileError(f"{self.path}: cannot read it: {exc.strerror or exc}") from None

    def read(self, count: int, digest: Any = None) -> bytearray:
        """The next ``count`` bytes (``readinto``). Raises PrivateFileError."""
        data = bytearray(count)
        self.readinto(memoryview(data), digest)
        return data

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> PrivateFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_private_file(
    path: str, base: str, limit: int, size: int | None = None, source: str = "the manifest"
) -> PrivateFile:
    """Open the file ``path`` under the private directory ``base`` to read it as this
    user's own: every folder from ``base`` down and the file must be real (no symbolic
    link: each is opened with ``O_NOFOLLOW``), the file regular (opened without
    blocking, so a FIFO never holds the caller), each owned by this user and not
    writable by group or others. Its size, on the open descriptor, must be ``size``
    when given (what ``source`` says) and at most ``limit``: checked before any byte
    is read.

    Raises:
        PrivateFileError: the one-line reason, naming the entry at fault."""
    fd = _walk(path, base, want_dir=False)
    try:
        actual = os.fstat(fd).st_size
        if size is not None and actual != size:
            raise PrivateFileError(f"{path}: {actual} bytes, {source} says {size}")
        if actual > limit:
            raise PrivateFileError(f"{path}: {actual} bytes, more than the {limit} it may hold")
        # Blocking reads from here on: a regular file's reads end (O_NONBLOCK only
        # mattered for the open).
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return PrivateFile(path, fd, actual)
