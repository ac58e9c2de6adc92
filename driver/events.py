"""The driver's event log: one JSON line per event to ``--events``, a readable line to stderr.

``EventLog(path, stream=sys.stderr, verbose=False).emit(kind, **fields)``:

* appends ``{"t": <unix time>, "elapsed": <seconds since the log was made>, "kind": kind,
  **fields}`` as one line to ``path`` (if given), written with a single ``write`` on an
  unbuffered file, so a driver that crashes leaves only complete lines behind (a torn
  last line is possible only if the machine itself dies; readers skip it);
* writes ``elastic-run: <text>`` to ``stream`` under ``driver.output.WRITE_LOCK`` (so it
  never splits a worker's output line). Routine kinds (``QUIET_KINDS``: worker started,
  checkpoint written, ...) reach the stream only with ``verbose``.

Every kind is a constant below and listed in ``KINDS``; ``FIELDS`` documents the
fields each one usually carries (``format_event`` copes with missing ones and shows
extra ones as ``key=value``). Any event may carry ``step`` (the newest committed
training step the driver knows of): ``driver.plot`` draws it.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from typing import Any, Mapping, Optional, TextIO

from rendezvous.errors import ElasticError

from driver.output import WRITE_LOCK

# ----------------------------------------------------------------------------- kinds

ROUND_FORMED = "round_formed"
WORKER_STARTED = "worker_started"
WORKER_EXITED = "worker_exited"
WORKER_FAILED = "worker_failed"
WORKER_STOPPED = "worker_stopped"
HOST_ADDED = "host_added"
HOST_REMOVED = "host_removed"
HOST_BLACKLISTED = "host_blacklisted"
HOST_BACK = "host_back"
DISCOVERY_ERROR = "discovery_error"
PS_STARTED = "ps_started"
PS_EXITED = "ps_exited"
PS_RESTARTED = "ps_restarted"
CHECKPOINT_WRITTEN = "checkpoint_written"
CHAOS_KILL = "chaos_kill"
JOB_DONE = "job_done"
JOB_FAILED = "job_failed"
WAITING = "waiting"
JOB_STARTED = "job_started"
WORKER_STOPPING = "worker_stopping"
FAILURE_REPORTED = "failure_reported"
HOST_SLOTS_CHANGED = "host_slots_changed"
HOST_BLACKLIST_SKIPPED = "host_blacklist_skipped"

FIELDS: dict[str, tuple[str, ...]] = {
    ROUND_FORMED: ("round", "size", "seconds", "hosts"),       # seconds: time to form it
    WORKER_STARTED: ("host", "slot", "pid", "worker_id", "rank"),
    WORKER_EXITED: ("host", "slot", "rank", "code"),            # code: exit code, -N = signal N
    WORKER_FAILED: ("host", "slot", "rank", "code", "reason"),
    WORKER_STOPPED: ("host", "slot", "rank", "code"),           # stopped by the driver
    HOST_ADDED: ("host", "slots"),
    HOST_REMOVED: ("host",),
    HOST_BLACKLISTED: ("host", "cooldown", "reason"),           # cooldown: seconds
    HOST_BACK: ("host",),
    DISCOVERY_ERROR: ("error",),
    PS_STARTED: ("shard", "address", "pid"),
    PS_EXITED: ("shard", "code"),
    PS_RESTARTED: ("shard", "step"),                            # step: checkpoint restored
    CHECKPOINT_WRITTEN: ("step", "path", "seconds"),
    CHAOS_KILL: ("host", "slot", "rank", "pid", "target"),      # target: "worker" | "ps"
    JOB_DONE: ("rounds", "seconds"),
    JOB_FAILED: ("reason", "rounds", "seconds"),
    WAITING: ("what", "waited"),                                # waited: seconds so far
    JOB_STARTED: ("job_id", "store", "np", "min_np", "max_np", "command"),
    WORKER_STOPPING: ("host", "slot", "reason"),                # SIGTERM sent, SIGKILL after grace
    FAILURE_REPORTED: ("reporter", "round", "reason", "suspect"),  # a worker saw a peer fail
    HOST_SLOTS_CHANGED: ("host", "old_slots", "new_slots"),
    HOST_BLACKLIST_SKIPPED: ("host", "failures", "remaining_slots", "min_np"),
}
KINDS = frozenset(FIELDS)

QUIET_KINDS = frozenset({WORKER_STARTED, WORKER_EXITED, WORKER_STOPPED, PS_STARTED,
                         CHECKPOINT_WRITTEN, WORKER_STOPPING, JOB_STARTED, JOB_FAILED,
                         FAILURE_REPORTED})
# (JOB_FAILED: elastic-run prints the reason itself, once.)
"""Kinds written to stderr only with ``verbose`` (always to the events file)."""

RESERVED_FIELDS = frozenset({"t", "elapsed", "kind"})


class EventError(ElasticError, ValueError):
    """``emit`` was given a kind not in ``KINDS`` or a reserved field name."""


class EventLogError(ElasticError):
    """The events file could not be opened."""


# ----------------------------------------------------------------------------- text


def describe_code(code: Any) -> str:
    """``exit 3``, ``killed by SIGKILL`` (for -9), or the value as it is."""
    if isinstance(code, bool) or not isinstance(code, int):
        return f"code {code}"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def _seconds(value: Any) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.2f}s" if value < 10 else f"{value:.0f}s"
    return str(value)


def _worker(f: dict) -> str:
    where = f"{f.pop('host', '?')}:{f.pop('slot', '?')}"
    rank = f.pop("rank", None)
    return f"worker [{rank}] {where}" if rank is not None else f"worker {where}"


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def format_event(kind: str, fields: Mapping[str, Any]) -> str:
    """The one-line text of an event (without the ``elastic-run:`` prefix). Never
    raises for missing or odd fields; fields the text does not use are appended as
    ``key=value``."""
    f = dict(fields)
    f.pop("t", None)
    f.pop("elapsed", None)
    text = _format(kind, f)
    extra = " ".join(f"{k}={v}" for k, v in f.items())
    return f"{text} ({extra})" if extra else text


def _format(kind: str, f: dict) -> str:
    g = f.pop
    if kind == ROUND_FORMED:
        text = f"round {g('round', '?')} formed: {_plural(g('size', '?'), 'worker')}"
        if "seconds" in f:
            text += f" in {_seconds(g('seconds'))}"
        if "hosts" in f:
            hosts = g("hosts")
            text += f" on {_plural(len(hosts), 'host')}" if isinstance(hosts, (list, tuple)) \
                else f" on {hosts}"
        return text
    if kind == WORKER_STARTED:
        w = _worker(f)
        return f"{w} started" + (f" (pid {g('pid')})" if "pid" in f else "")
    if kind in (WORKER_EXITED, WORKER_FAILED, WORKER_STOPPED):
        w = _worker(f)
        code = f" ({describe_code(g('code'))})" if "code" in f else ""
        if kind == WORKER_EXITED:
            return f"{w} exited{code}"
        if kind == WORKER_STOPPED:
            return f"{w} stopped{code}"
        reason = f": {g('reason')}" if "reason" in f else ""
        return f"{w} failed{code}{reason}"
    if kind == HOST_ADDED:
        return f"host {g('host', '?')} added" + (f" ({_plural(g('slots'), 'slot')})"
                                                 if "slots" in f else "")
    if kind == HOST_REMOVED:
        return f"host {g('host', '?')} removed"
    if kind == HOST_BLACKLISTED:
        text = f"host {g('host', '?')} blacklisted"
        if "cooldown" in f:
            text += f" for {_seconds(g('cooldown'))}"
        return text + (f": {g('reason')}" if "reason" in f else "")
    if kind == HOST_BACK:
        return f"host {g('host', '?')} is back from the blacklist"
    if kind == DISCOVERY_ERROR:
        return f"host discovery failed: {g('error', '?')}"
    if kind == PS_STARTED:
        text = f"ps shard {g('shard', '?')} started"
        if "address" in f:
            text += f" on {g('address')}"
        return text + (f" (pid {g('pid')})" if "pid" in f else "")
    if kind == PS_EXITED:
        return f"ps shard {g('shard', '?')} exited" + (f" ({describe_code(g('code'))})"
                                                       if "code" in f else "")
    if kind == PS_RESTARTED:
        return f"ps shard {g('shard', '?')} restarted" + (f" from step {g('step')}"
                                                          if "step" in f else "")
    if kind == CHECKPOINT_WRITTEN:
        text = f"checkpoint of step {g('step', '?')} written"
        if "seconds" in f:
            text += f" in {_seconds(g('seconds'))}"
        return text + (f" to {g('path')}" if "path" in f else "")
    if kind == CHAOS_KILL:
        target = g("target", "worker")
        if target == "ps":
            text = f"chaos: killed ps shard {g('shard', '?')}"
        else:
            text = f"chaos: killed {_worker(f)}"
        return text + (f" (pid {g('pid')})" if "pid" in f else "")
    if kind == JOB_DONE:
        text = "job done"
        if "rounds" in f:
            text += f" after {_plural(g('rounds'), 'round')}"
        return text + (f" in {_seconds(g('seconds'))}" if "seconds" in f else "")
    if kind == JOB_FAILED:
        return f"job failed: {g('reason', '?')}"
    if kind == JOB_STARTED:
        return f"job {g('job_id', '?')} started on store {g('store', '?')}"
    if kind == WORKER_STOPPING:
        return f"stopping {_worker(f)}" + (f": {g('reason')}" if "reason" in f else "")
    if kind == FAILURE_REPORTED:
        text = f"worker {g('reporter', '?')} reports a failure in round {g('round', '?')}"
        if f.get("suspect"):
            text += f", blaming {g('suspect')}"
        else:
            f.pop("suspect", None)
        return text + (f": {g('reason')}" if "reason" in f else "")
    if kind == HOST_SLOTS_CHANGED:
        return f"host {g('host', '?')} now has {g('new_slots', '?')} slots (was {g('old_slots', '?')})"
    if kind == HOST_BLACKLIST_SKIPPED:
        return (f"host {g('host', '?')} failed {g('failures', '?')} times but stays: "
                f"blacklisting it would leave {g('remaining_slots', '?')} slots, below "
                f"--min-np {g('min_np', '?')}")
    if kind == WAITING:
        text = f"waiting for {g('what', '?')}"
        return text + (f" ({_seconds(g('waited'))} so far)" if "waited" in f else "")
    return kind


# ----------------------------------------------------------------------------- the log


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


def encode_event(kind: str, fields: Mapping[str, Any], t: float, elapsed: float) -> bytes:
    """One events-file line: strict JSON (no NaN), UTF-8, ending in a newline. Values
    JSON cannot hold are written as their ``str``."""
    record = {"t": round(t, 6), "elapsed": round(elapsed, 6), "kind": kind, **fields}
    try:
        text = json.dumps(record, default=_json_default, ensure_ascii=False, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(record), default=_json_default, ensure_ascii=False,
                          allow_nan=False)
    return (text + "\n").encode("utf-8", "surrogateescape")


class EventLog:
    """Writes events to the events file and to ``stream`` (see the module docstring).

    ``path`` None: no file. The file is truncated when the log is made (one file per
    run). Raises ``EventLogError`` if it cannot be opened. Safe to use from several
    threads. Write failures after that (full disk, closed stream) are swallowed: the
    event log must never be the reason a job fails."""

    def __init__(self, path: Optional[str], stream: Optional[TextIO] = None,
                 verbose: bool = False, prefix: str = "elastic-run"):
        self.path = path
        self._stream = stream
        self.verbose = verbose
        self.prefix = prefix
        self.start_monotonic = time.monotonic()
        self.start_time = time.time()
        self._lock = threading.Lock()
        self._fd: Optional[int] = None
        if path is not None:
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
                                   0o644)
            except OSError as e:
                raise EventLogError(f"cannot open the events file {path!r}: "
                                    f"{e.strerror or e}") from e

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def elapsed(self) -> float:
        """Seconds since the log was made (monotonic)."""
        return time.monotonic() - self.start_monotonic

    def emit(self, kind: str, **fields: Any) -> dict:
        """Record one event; returns the record written. Raises ``EventError`` for an
        unknown kind or a field named ``t``/``elapsed``/``kind``."""
        if kind not in KINDS:
            raise EventError(f"unknown event kind {kind!r}")
        reserved = RESERVED_FIELDS.intersection(fields)
        if reserved:
            raise EventError(f"reserved event field(s) {sorted(reserved)} in {kind}")
        t, elapsed = time.time(), self.elapsed()
        line = encode_event(kind, fields, t, elapsed)
        with self._lock:
            if self._fd is not None:
                try:
                    # One write of the whole line: a crash leaves whole lines only.
                    os.write(self._fd, line)
                except OSError:
                    pass
        if self.verbose or kind not in QUIET_KINDS:
            self._print(f"{self.prefix}: {format_event(kind, fields)}\n")
        return {"t": t, "elapsed": elapsed, "kind": kind, **fields}

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
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
