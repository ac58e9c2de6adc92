"""A standby driver's wait for the leader's seat (``driver.leadership.claim``, under
``--standby``): it watches the leader record until it is deleted, and ends the lease of
a leader whose beat (``JobKeys.leader_beat``) has been silent for ``BEAT_SILENCE``.

Why it is careful: a silent store is not a silent leader. A beat missed while the store
itself does not answer within ``STORE_ANSWER`` is counted again once it does, and a
leader record that vanished while the store was in trouble (every lease lapses when a
stalled store answers again) is given ``RETURN_GRACE`` to be written again before the
seat is taken (``driver.policy.lapses.lapse_explained``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from driver.errors import JobFailed
from driver.policy.lapses import lapse_explained
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.schema.agents import RETURN_GRACE
from rendezvous.store import KVStore

log = logging.getLogger(__name__)

STORE_ANSWER = 0.5
"""Seconds a read of the store may take for a standby to trust what it does not see:
a leader's beats missing while the store itself answers late are the store's silence."""

STANDBY_POLL = 0.05
"""Seconds between a standby's looks at its stop flag and the leader's beat."""

BEAT_SILENCE = 1.0
"""Seconds without a beat after which a standby ends the leader's lease (a leader that
is only slow loses the lead to it: fencing makes that harmless)."""


def wait_vacant(
    store: KVStore,
    keys: JobKeys,
    revision: int,
    stop: threading.Event | None,
    lease: int,
    beating: bool,
) -> None:
    """Watch the leader key from ``revision`` + 1 until it is deleted (the leader's
    lease lapsed, or it released the job). A leader that beats (``JobKeys.leader_beat``)
    and falls silent for ``BEAT_SILENCE`` has its lease (``lease``) ended here
    (``beating``: it beat as of ``revision``; the silence counts from now).

    Raises:
        JobFailed: ``stop`` was set first.
        RendezvousError: the watch failed for good.
    """
    start = revision + 1
    with contextlib.ExitStack() as watches:
        watch = watches.enter_context(store.watch_prefix(keys.driver, start_revision=start))
        beats = watches.enter_context(store.watch_prefix(keys.leader_beat, start_revision=start))
        last_beat: float | None = time.monotonic() if beating else None
        store_silent_at: float | None = None  # when the store last did not answer us
        vacant_until: float | None = None  # the seat is empty: taken after this
        while True:
            if stop is not None and stop.is_set():
                raise JobFailed("stopped while standing by; this driver never led the job")
            if vacant_until is not None and time.monotonic() > vacant_until:
                return
            event = watch.get(timeout=STANDBY_POLL)
            if event is not None and event.key == keys.driver:
                if event.type == "delete":
                    if not lapse_explained(store_silent_at, time.monotonic()):
                        return
                    # Its lease lapsed when the stalled store answered again, as ours
                    # did: the leader takes its seat again within seconds.
                    vacant_until = time.monotonic() + RETURN_GRACE
                    continue
                vacant_until = None
                lease = event.kv.lease  # the leader took its seat again under a new lease
            while (beat := beats.get(timeout=0)) is not None:
                if beat.key == keys.leader_beat and beat.type != "delete":
                    last_beat = time.monotonic()
            if last_beat is not None and time.monotonic() - last_beat > BEAT_SILENCE:
                if not _store_answers(store):
                    # The store itself is silent (stalled, or cut off from us): its
                    # silence says nothing of the leader's. Count again once it answers.
                    last_beat = store_silent_at = time.monotonic()
                    continue
                log.warning(
                    "the leader of job %s has not beaten for %.1fs: ending its lease",
                    keys.job_id,
                    time.monotonic() - last_beat,
                )
                with contextlib.suppress(RendezvousError):
                    store.revoke(lease)
                last_beat = None  # its record's deletion follows


def _store_answers(store: KVStore) -> bool:
    """Whether ``store`` answers one read within ``STORE_ANSWER`` seconds."""
    began = time.monotonic()
    try:
        store.revision()
    except RendezvousError:
        return False
    return time.monotonic() - began <= STORE_ANSWER
