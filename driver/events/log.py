"""The event log: one JSON line per event to ``--events``, a readable line to stderr.

``EventLog(path, stream=sys.stderr, verbose=False).emit(event)`` takes an event of
``driver.events`` and:

* appends ``{"t": <unix time>, "elapsed": <seconds since the log was made>, "kind":
  event.kind, **fields}`` as one line to ``path`` (if given), written with a single
  ``write`` on an unbuffered file, so a driver that crashes leaves only complete lines
  behind (a torn last line is possible only if the machine itself dies; readers skip it).
  The file is appended to, never truncated: several runs may share it, each one
  beginning with its ``job_started`` line (``runplot`` draws the last run);
* writes ``elastic-run: <str(event)>`` to ``stream`` (with ``timestamps``,
  ``elastic-run [YYYY-MM-DD HH:MM:SS]: ...`` in local time, as the driver's own lines
  are) under ``driver.threads.WRITE_LOCK`` (so it never splits a worker's output
  line). Quiet events reach the stream only with ``verbose``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TextIO

from driver.errors import EventError, EventLogError
from driver.events import Event, is_known
from driver.threads import WRITE_LOCK


def _json_default(value: Any) -> Any:
    # Sets, tuples of odd things, exceptions, paths: never let an event crash the driver.
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None (strict JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def encode_event(record: Mapping[str, Any]) -> bytes:
    """One events-file line: strict JSON (no NaN), UTF-8, ending in a newline. Values
    JSON cannot hold are written as their ``str``."""
    try:
        text = json.dumps(record, default=_json_default, ensure_ascii=False, allow_nan=False)
    except ValueError:
        text = json.dumps(
            _finite(record), default=_json_default, ensure_ascii=False, allow_nan=False
        )
    return (text + "\n").encode("utf-8", "surrogateescape")


def line_prefix(prefix: str, timestamps: bool, now: float | None = None) -> str:
    """``prefix: ``, or with ``timestamps`` ``prefix [YYYY-MM-DD HH:MM:SS]: `` in local
    time (``now``: a unix time, default the current one): how every line the driver
    itself writes to stderr begins."""
    if not timestamps:
        return f"{prefix}: "
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    return f"{prefix} [{stamp}]: "


class EventLog:
    """Writes events to the events file and to ``stream`` (see the module docstring).

    ``path`` None: no file. The file is appended to (``--events`` says so: a second run
    must not destroy the record of the first). Safe to use from several threads. Write failures after the file is open (full
    disk, closed stream) are swallowed: the event log must never be the reason a job
    fails.

    Raises:
        EventLogError: the events file cannot be opened.
    """

    def __init__(
        self,
        path: str | None,
        stream: TextIO | None = None,
        verbose: bool = False,
        prefix: str = "elastic-run",
        timestamps: bool = False,
    ):
        self.path = path
        self._stream = stream
        self.verbose = verbose
        self.prefix = prefix
        self.timestamps = timestamps
        self.start_monotonic = time.monotonic()
        self.start_time = time.time()
        self._lock = threading.Lock()
        self._fd: int | None = None
        if path is not None:
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            except OSError as e:
                raise EventLogError(
                    f"cannot open the events file {path!r}: {e.strerror or e}"
                ) from e

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def elapsed(self) -> float:
        """Seconds since the log was made (monotonic)."""
        return time.monotonic() - self.start_monotonic

    def emit(self, event: Event) -> dict[str, Any]:
        """Record one event; returns the record written.

        Raises:
            EventError: ``event`` is not an event of the vocabulary.
        """
        if not is_known(event):
            raise EventError(f"unknown event kind {event!r}")
        record = {
            "t": round(time.time(), 6),
            "elapsed": round(self.elapsed(), 6),
            "kind": event.kind,
            **{f.name: getattr(event, f.name) for f in fields(event)},
        }
        line = encode_event(record)
        with self._lock:
            if self._fd is not None:
                # One write of the whole line: a crash leaves whole lines only.
                with contextlib.suppress(OSError):
                    os.write(self._fd, line)
        if self.verbose or not event.quiet:
            self._print(f"{line_prefix(self.prefix, self.timestamps)}{event}\n")
        return record

    def _print(self, text: str) -> None:
        stream = self.stream
        with WRITE_LOCK:
            try:
                stream.write(text)
                stream.flush()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
