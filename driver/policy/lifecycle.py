"""The driver's record of each worker it launched: one lifecycle state, and the facts
the rules need (pure values; no process, no clock).

A record is replaced, never changed: each transition below returns a new one, and the
job's main loop keeps the newest per worker id. The lifecycle::

    LAUNCHED ----registered---> REGISTERED ---registration lapsed---> UNREGISTERED
                                    ^------------registered again-----------'
    active (LAUNCHED, REGISTERED, UNREGISTERED) --stop--> STOPPING
    active --kill--> KILLED         active --chaos kill--> CHAOS_KILLED
    STOPPING --exit, any code--> STOPPED
    any other running state --exit 0--> FINISHED, --any other exit--> FAILED

A spare (``--spares``) has the same lifecycle, but is no candidate member while it is
a spare: its ``slot`` is its index among its host's spares, not a member slot, until
``promoted`` gives it a member slot.

Only REGISTERED workers (not spares) can be members of a new round. A worker the driver stops or
kills stops being a candidate at once, not when its exit is seen: the driver has given
up on it. A chaos victim's failure is not held against its host.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace

from rendezvous.schema.workers import WorkerInfo


class WorkerState(enum.Enum):
    LAUNCHED = "launched"  # started; not registered yet
    REGISTERED = "registered"  # its registration is in the store: it can be a member
    UNREGISTERED = "unregistered"  # its registration lapsed while its process runs
    STOPPING = "stopping"  # the driver stops it: its exit is no failure
    KILLED = "killed"  # SIGKILLed by the driver (hung, unresponsive)
    CHAOS_KILLED = "chaos_killed"  # SIGKILLed by --chaos-kill-interval: not its host's fault
    FINISHED = "finished"  # exited 0 on its own
    FAILED = "failed"  # exited with an error or a signal (or was killed)
    STOPPED = "stopped"  # exited after the driver stopped it

    @property
    def running(self) -> bool:
        """The process has not exited (as far as the driver has seen)."""
        return self not in _EXITED

    @property
    def active(self) -> bool:
        """Running and not given up on: neither being stopped nor killed."""
        return self in _ACTIVE


_EXITED = frozenset({WorkerState.FINISHED, WorkerState.FAILED, WorkerState.STOPPED})
_ACTIVE = frozenset({WorkerState.LAUNCHED, WorkerState.REGISTERED, WorkerState.UNREGISTERED})


@dataclass(frozen=True)
class WorkerRecord:
    """One launched worker. ``since``: when it entered ``state`` (for UNREGISTERED, when
    its registration lapsed). ``info``: its registration while the key exists.
    ``registered_seq``: the store revision that created its registration, so workers
    order by when they (last) registered. ``exit_code`` once it exited. ``kill_reason``:
    why the driver (or, ``"chaos"``, the chaos monkey) SIGKILLed it, kept after the exit
    so that the failure can say who killed it and why. ``spare``: it was launched as a
    spare and not promoted yet (``slot`` is then its index among its host's spares)."""

    worker_id: str
    host: str
    slot: int
    launched_at: float
    state: WorkerState = WorkerState.LAUNCHED
    since: float = 0.0
    info: WorkerInfo | None = None
    registered_seq: int = 0
    exit_code: int | None = None
    kill_reason: str | None = None
    spare: bool = False

    @classmethod
    def launched(
        cls, worker_id: str, host: str, slot: int, now: float, spare: bool = False
    ) -> WorkerRecord:
        """A worker (a spare, its ``slot`` its spare index) started at ``now``."""
        return cls(worker_id, host, slot, launched_at=now, since=now, spare=spare)

    @property
    def live(self) -> bool:
        """Registered, running and no spare: a candidate member of the next round."""
        return self.state is WorkerState.REGISTERED and not self.spare

    @property
    def ready_spare(self) -> bool:
        """A registered spare: it can be promoted at once (it is imported and joined)."""
        return self.state is WorkerState.REGISTERED and self.spare

    @property
    def ever_registered(self) -> bool:
        """It registered at some point (its program started and joined the job)."""
        return self.registered_seq > 0

    @property
    def died_on_its_own(self) -> bool:
        """It exited with an error or a signal nobody in the driver sent: not stopped,
        not killed by the driver or the chaos."""
        return self.state is WorkerState.FAILED and self.kill_reason is None


Workers = Mapping[str, WorkerRecord]
"""The job's records by worker id, as the rules read them."""


def registered(
    rec: WorkerRecord, info: WorkerInfo, created_revision: int, now: float
) -> WorkerRecord:
    """Its registration was written (``created_revision``: the revision that created
    the key). A worker on its way out only has its registration noted. The driver's
    slot wins over the registration's: a promoted spare registered with its spare index."""
    info = replace(info, slot=rec.slot)
    if rec.state in (WorkerState.LAUNCHED, WorkerState.UNREGISTERED):
        return replace(
            rec, state=WorkerState.REGISTERED, since=now, info=info, registered_seq=created_revision
        )
    return replace(rec, info=info, registered_seq=created_revision)


def promoted(rec: WorkerRecord, slot: int, now: float) -> WorkerRecord:
    """The spare takes member slot ``slot`` of its host (its registration follows)."""
    info = replace(rec.info, slot=slot) if rec.info is not None else None
    return replace(rec, spare=False, slot=slot, info=info, since=now)


def unregistered(rec: WorkerRecord, now: float) -> WorkerRecord:
    """Its registration vanished (lease expired) while the process runs."""
    if rec.state in (WorkerState.LAUNCHED, WorkerState.REGISTERED):
        return replace(rec, state=WorkerState.UNREGISTERED, since=now, info=None)
    return replace(rec, info=None)


def stopping(rec: WorkerRecord, now: float) -> WorkerRecord:
    """The driver sent it SIGTERM."""
    return replace(rec, state=WorkerState.STOPPING, since=now)


def killed(rec: WorkerRecord, now: float, chaos: bool = False, reason: str = "") -> WorkerRecord:
    """The driver (or, with ``chaos``, the chaos monkey) sent it SIGKILL, for ``reason``."""
    state = WorkerState.CHAOS_KILLED if chaos else WorkerState.KILLED
    return replace(rec, state=state, since=now, kill_reason="chaos" if chaos else reason)


def exited(rec: WorkerRecord, code: int, now: float) -> WorkerRecord:
    """Its process exited with ``code``: STOPPED if the driver was stopping it, else
    FINISHED for 0 and FAILED for anything else."""
    if rec.state is WorkerState.STOPPING:
        state = WorkerState.STOPPED
    else:
        state = WorkerState.FINISHED if code == 0 else WorkerState.FAILED
    return replace(rec, state=state, since=now, info=None, exit_code=code)
