"""Where the agent's forwarded output goes: its stdout (the driver's ssh session or pipe,
while it lasts) and its per-host log file (which outlives the driver).

``Tee`` is a binary stream for ``driver.launch.output.write_line``: each whole line is
written to both; a destination that fails (the driver is gone: EPIPE) is dropped and
the other goes on, so the workers never block on their output.
"""

from __future__ import annotations

import contextlib
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
    """The agent's log file, appended to, unbuffered.

    Raises:
        OSError: it cannot be opened.
    """
    return open(path, "ab", buffering=0)


def close_quietly(stream: BinaryIO | None) -> None:
    if stream is not None:
        with contextlib.suppress(OSError):
            stream.close()
