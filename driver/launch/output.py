"""Forwarding of worker output to the driver's stdout and stderr, line by line, prefixed.

A worker's stdout and stderr are pipes; an ``OutputForwarder`` runs one daemon thread
per pipe that reads lines and writes each one, prefixed, to the driver's matching
stream. The prefix is asked of a callable *per line* (``[rank]`` once the worker has
a rank, ``[host:slot]`` before), because a worker's rank changes between rounds.

Guarantees:

* a line is written with one ``write`` under ``WRITE_LOCK``, a single lock shared by
  every forwarder (and by ``driver.events.log``), so lines of different workers, or an
  event line, never interleave inside a line;
* bytes are forwarded as they are (written to the stream's binary buffer when it has
  one); a stream that only takes text gets them decoded with replacement characters,
  so binary junk never raises;
* a last line without a newline gets one; a line longer than ``MAX_LINE`` bytes is
  split into several prefixed lines (a worker that never prints a newline cannot make
  the driver buffer without bound);
* a failing destination (closed stdout, a broken pipe to ``| head``) or a prefix
  callable that raises never stops the pump: the pipe is still drained to EOF, so the
  worker never blocks on a full pipe;
* threads end at EOF, i.e. when the worker and every descendant holding the pipe exit.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
import time
from typing import IO, BinaryIO, Callable, TextIO, Union, cast

from driver.threads import WRITE_LOCK

MAX_LINE = 64 * 1024
"""Longest line forwarded in one piece, in bytes; longer lines are split."""

Stream = Union[TextIO, BinaryIO]
PrefixFn = Callable[[], str]


def worker_prefix(rank: int | None, label: str) -> str:
    """``[rank]`` when the rank is known, else ``[label]`` (``label`` is ``host:slot``)."""
    return f"[{rank}]" if rank is not None else f"[{label}]"


def format_line(prefix: str, line: bytes) -> bytes:
    """One output line: ``prefix``, a space, the line, exactly one trailing newline
    (an empty ``prefix``: the line as it is, for output prefixed already, an agent's)."""
    if not line.endswith(b"\n"):
        line += b"\n"
    if not prefix:
        return line
    return prefix.encode("utf-8", "replace") + b" " + line


def write_line(stream: Stream, data: bytes) -> None:
    """Write ``data`` (one whole line) to ``stream`` under ``WRITE_LOCK`` and flush it.

    Bytes go to the stream's binary buffer when it has one (after flushing the text
    layer, so the driver's own prints keep their order); a text-only stream gets them
    decoded with replacement. Raises whatever the stream raises (``OSError``,
    ``ValueError`` for a closed file); callers that must not fail catch it."""
    with WRITE_LOCK:
        buffer = getattr(stream, "buffer", None)
        if buffer is not None:
            stream.flush()
            buffer.write(data)
            buffer.flush()
        elif isinstance(stream, io.TextIOBase):
            stream.write(data.decode("utf-8", "replace"))
            stream.flush()
        else:
            cast(BinaryIO, stream).write(data)
            stream.flush()


class OutputForwarder:
    """Pumps one worker's stdout and stderr pipes to the driver's streams.

    ``prefix_fn`` is called for every line and returns the prefix without the trailing
    space (e.g. ``"[3]"``). ``out``/``err`` default to ``sys.stdout``/``sys.stderr`` as
    they are when a line is written (so redirections made later are honoured).
    ``log_path``, if given, also receives every line unprefixed (a per-worker log for
    ``--log-dir``); it is opened in append mode by ``start`` (``OSError`` propagates).
    Output is only ever forwarded: what the driver must know from a process comes
    through the store, never from its output.
    """

    def __init__(
        self,
        prefix_fn: PrefixFn,
        out: Stream | None = None,
        err: Stream | None = None,
        name: str = "worker",
        log_path: str | None = None,
    ):
        self.prefix_fn = prefix_fn
        self._out = out
        self._err = err
        self.name = name
        self.log_path = log_path
        self._log: BinaryIO | None = None
        self._log_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._open_pumps = 0  # the last pump to end closes the log

    def start(self, stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        """Start one daemon thread per given pipe (binary, readable). Each thread closes
        its pipe at EOF."""
        if self.log_path is not None:
            # Open for the pumps' lifetime; the last pump to end closes it.
            self._log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115
        pipes = [
            (pipe, which) for pipe, which in ((stdout, "out"), (stderr, "err")) if pipe is not None
        ]
        # Count every pump before starting any, so the first to end cannot close the log
        # while the other has not started yet.
        self._open_pumps = len(pipes)
        for pipe, which in pipes:
            t = threading.Thread(
                target=self._pump,
                args=(pipe, which),
                name=f"output-{self.name}-{which}",
                daemon=True,
            )
            self._threads.append(t)
            t.start()
        if not pipes:
            self._open_pumps = 1
            self._pump_ended()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds in total for both pumps to reach EOF; True if
        they did. (A descendant of the worker that keeps the pipe open keeps its pump
        running: the caller decides how long to wait.)"""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not self.alive

    @property
    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def _destination(self, which: str) -> Stream:
        if which == "out":
            return self._out if self._out is not None else sys.stdout
        return self._err if self._err is not None else sys.stderr

    def _prefix(self) -> str:
        try:
            return str(self.prefix_fn())
        except Exception:  # noqa: BLE001  (a broken prefix must not lose the worker's output)
            return f"[{self.name}]"

    def _pump(self, pipe: IO[bytes], which: str) -> None:
        broken = False
        try:
            while True:
                try:
                    line = pipe.readline(MAX_LINE)
                except (OSError, ValueError):
                    break  # the pipe was closed under us: nothing more to read
                if not line:
                    break
                self._log_line(line)
                if broken:
                    continue  # keep draining so the worker never blocks on a full pipe
                try:
                    write_line(self._destination(which), format_line(self._prefix(), line))
                except (OSError, ValueError):
                    broken = True  # the driver's stream is gone (closed, EPIPE)
        finally:
            with contextlib.suppress(OSError):
                pipe.close()
            self._pump_ended()

    def _log_line(self, line: bytes) -> None:
        if self._log is None:
            return
        if not line.endswith(b"\n"):
            line += b"\n"
        with self._log_lock:
            try:
                if self._log is not None:
                    self._log.write(line)
            except (OSError, ValueError):
                pass  # a full disk must not stop forwarding to the terminal

    def _pump_ended(self) -> None:
        with self._log_lock:
            self._open_pumps -= 1
            if self._open_pumps > 0:
                return
            log, self._log = self._log, None
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()
