"""Directories only the job's user can change (the ps checkpoint root).

A directory that another local user created in advance, or can write, is not the job's:
that user could plant files the job then loads as its own (weights, optimizer state), or
rename and delete the job's files. ``check_private_dir`` refuses such a directory with a
one-line error that names it and the fix; ``make_private_dir`` creates a missing one
readable by its owner only, then checks it (someone may have made it first). The driver
checks ``--ps-checkpoint-dir`` before it starts anything, and every shard checks its
``--checkpoint-dir`` again before it reads or writes there.
"""

from __future__ import annotations

import os
import pwd
import stat

from rendezvous.errors import RendezvousConfigError


class InsecureDirectoryError(RendezvousConfigError):
    """A directory owned by another user, writable by group or others, or not examinable."""


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


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
