"""Where the agent's forwarded output goes: its stdout (the driver's ssh session or pipe,
while it lasts) and its per-host log file (which outlives the driver).

``Tee`` is a binary stream for ``driver.launch.output.write_line``: each whole line is
written to both; a destination that fails (the driver is gone: EPIPE) is dropped and
the other goes on, so the workers never block on their output.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from typing import BinaryIO


class Tee:
    """Writes every line to ``stream`` (until it fails) and to ``log`` (if any)."""

    def __init__(self, stream: BinaryIO | None, log: BinaryIO | None):
        self._stream = stream
        self._log = log
        self._lock = threading.Lock()

    def write(self, data: bytes) -> int:
        with self._lock:
            for which in ("_stream", "_log"):
                dest: BinaryIO | None = getattr(self, which)
                if dest is None:
                    continue
                try:
                    dest.write(data)
                    dest.flush()
                except (OSError, ValueError):
                    setattr(self, which, None)  # gone for good: the other goes on
        return len(data)

    def flush(self) -> None:
        """Each write flushes already."""


def open_log(path: str) -> BinaryIO:
    """The agent's log file, appended to, unbuffered, readable by its owner only. Its
    default path is predictable (``driver.agent.__main__.default_log_path``), so what
    another user may have planted there is refused: a symbolic link is never followed,
    and the file must be a regular one of this user's.

    Raises:
        OSError: it cannot be opened, or is a link, not a regular file, or another
            user's (the message names the path).
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        message = f"agent log {path}: {exc.strerror} (a link is not followed)"
        raise OSError(exc.errno, message) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(f"agent log {path}: not a regular file of this user's; refused")
        os.fchmod(fd, 0o600)  # (one an older version made 0644)
        return os.fdopen(fd, "ab", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def close_quietly(stream: BinaryIO | None) -> None:
    if stream is not None:
        with contextlib.suppress(OSError):
            stream.close()
