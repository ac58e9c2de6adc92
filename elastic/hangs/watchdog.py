"""The hang watchdog: a thread of each worker of an ``elastic-run`` job that reads the
training clock (``elastic.hangs.clock``) and, when the training is hung, sends the
driver every thread's Python stack (``FailureRecord`` with ``hung``, under
``JobKeys.hung``); the driver logs them, says ``hung`` and kills the worker, whose peers'
collectives then raise at once as for any lost worker.

A report is sent once per stall (again after ``REPORT_AGAIN`` while the stall lasts, in
case a report was lost): a training that moves again and stalls again is reported
again. The thread needs the GIL briefly every tick (at most a second); a C
extension that holds the GIL for good stops it, and the ring's heartbeats with it,
which the ring's failure monitor reports (a silent peer).

``install_stack_dump`` makes SIGUSR1 print every thread's stack on stderr, from C
(``faulthandler``: it works whatever the threads hold), for ``elastic-run``'s SIGUSR1.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import threading
import time
import traceback
from types import FrameType
from typing import Protocol

from elastic.hangs.clock import CLOCK, ClockView, HangSettings, TrainingClock, hang_after
from elastic.worker_reports import put_report
from rendezvous import env
from rendezvous.errors import RendezvousConfigError
from rendezvous.keys import JobKeys
from rendezvous.schema.workers import FailureRecord
from rendezvous.store import KVStore

log = logging.getLogger(__name__)

#: the watchdog looks at the clock this often at most (and ten times per timeout at least)
MAX_TICK = 1.0
#: a stall still going on is reported again after this long (or its timeout, if longer):
#: a report the store lost, or a driver that took the job over since, still hears of it
REPORT_AGAIN = 30.0


class Reporting(Protocol):
    """What the watchdog reads of a worker's runtime (``elastic.runtime.WorkerRuntime``)."""

    keys: JobKeys

    @property
    def store(self) -> KVStore | None: ...

    @property
    def lease_id(self) -> int: ...

    @property
    def round_id(self) -> int: ...


def settings_from_env() -> HangSettings:
    """``ELASTIC_HANG_TIMEOUT`` (``--hang-timeout``): seconds, 0 never, unset or empty:
    adapt.

    Raises:
        RendezvousConfigError: it is set to no number of seconds (one line naming it).
    """
    raw = env.text(env.ENV_HANG_TIMEOUT)
    if raw is None:
        return HangSettings()
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise RendezvousConfigError(
            f"{env.ENV_HANG_TIMEOUT}={raw!r} is no timeout: use seconds (0: off), or unset"
        )
    return HangSettings(timeout=value)


def where(frame: FrameType) -> str:
    """``file:line in function`` of ``frame``."""
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def thread_stacks(first: int | None = None) -> tuple[str, str]:
    """Every thread's Python stack as text (thread ``first``'s first, marked the training
    thread), and where thread ``first`` is (``where``; "" when it is not running)."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    at = where(frames[first]) if first in frames else ""
    parts = []
    for ident in sorted(frames, key=lambda i: (i != first, names.get(i, ""))):
        mark = ", the training thread" if ident == first else ""
        head = f"Thread {names.get(ident, '?')!r} ({ident:#x}{mark}), most recent call last:\n"
        parts.append(head + "".join(traceback.format_stack(frames[ident])))
    return "\n".join(parts), at


def hang_report(worker_id: str, round_id: int, view: ClockView, timeout: float, now: float):
    """The report of ``worker_id``'s hung training (``view`` at ``now``, past ``timeout``)."""
    stacks, at = thread_stacks(view.thread_id)
    stalled = now - view.since
    reason = f"no collective for {stalled:.1f}s (hang timeout {timeout:g}s)" + (
        f", training at {at}" if at else ""
    )
    return FailureRecord(worker_id, round_id, reason, worker_id, hung=True, stacks=stacks)


class Watchdog:
    """The thread (see the module docstring); ``stop`` ends it."""

    def __init__(
        self,
        runtime: Reporting,
        worker_id: str,
        settings: HangSettings,
        clock: TrainingClock = CLOCK,
    ):
        self._runtime = runtime
        self._worker_id = worker_id
        self._settings = settings
        self._clock = clock
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="elastic-hang-watchdog", daemon=True)

    def start(self) -> None:
        if not self._settings.off:
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _tick(self) -> float:
        timeout = self._settings.timeout
        return MAX_TICK if timeout is None else max(0.05, min(MAX_TICK, timeout / 10))

    def _run(self) -> None:
        reported: float | None = None  # the stall reported (its clock's ``since``)
        reported_at = 0.0
        while not self._stopped.wait(self._tick()):
            view, now = self._clock.view(), time.monotonic()
            timeout = hang_after(view, now, self._settings)
            if timeout is None:
                continue
            if view.since == reported and now - reported_at < max(timeout, REPORT_AGAIN):
                continue
            reported, reported_at = view.since, now
            try:
                self._report(view, timeout, now)
            except Exception:  # the watchdog must not die of one report
                log.exception("could not report this worker's hang")

    def _report(self, view: ClockView, timeout: float, now: float) -> None:
        runtime = self._runtime
        round_id = runtime.round_id
        record = hang_report(self._worker_id, round_id, view, timeout, now)
        log.warning("training hung: %s; its stacks go to the driver", record.reason)
        key = runtime.keys.hung(round_id, self._worker_id)
        put_report(runtime.store, runtime.lease_id, key, record.to_json())


def install_stack_dump() -> None:
    """SIGUSR1 prints every thread's stack on stderr (fd 2), from C: see the module
    docstring. Not where signals cannot be set (not the main thread, no such signal)."""
    try:
        faulthandler.register(signal.SIGUSR1, file=2, all_threads=True, chain=False)
    except (AttributeError, ValueError, RuntimeError, OSError) as exc:
        log.debug("no stack dump on SIGUSR1: %s", exc)
