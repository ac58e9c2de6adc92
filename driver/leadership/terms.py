"""Who leads a job, as pure rules: what a starting driver does, how a steering write is
fenced, what a failed fence means (the I/O that carries them out: ``driver.leadership.claim``).

* Terms. The leader's record (``JobKeys.driver``, under its lease) carries its term;
  ``JobKeys.term`` keeps the newest term without a lease, so it outlives a leader whose
  key lapsed. A driver takes the lead in one transaction on the leader key's absence
  and the term key's revision: it writes its record with ``next_term`` and the term
  key. Of two drivers racing for a vacancy exactly one wins.
* Starting (``claim_action``). A live leader: refused (``REFUSE``), or with
  ``--standby`` waited on (``WAIT``). No leader but the job is alive (``job_alive``:
  a key of the job held by a lease other than a leader's, i.e. a registered worker,
  an agent, a shard): the job is adopted (``ADOPT``). Nothing alive: what is left is
  stale and the job starts afresh (``FRESH``); a standby that has seen a leader go
  and finds nothing alive learns that the job ended (``ENDED``).
* Fencing (``fence``). Every steering write (plans, ps configuration, the persisted
  driver state, the guard before a launch, a kill or a stop) is a transaction that
  holds only while the leader key is still this driver's record. A failed fence
  (``after_failed_fence``): another record holds the key, so leadership is lost
  (stop steering at once, ``lost_reason`` names the new leader); or the key is absent
  (this driver's lease lapsed, nobody took over): take it again and retry.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from rendezvous.keys import JobKeys
from rendezvous.schema.leader import DriverRecord
from rendezvous.store import Compare, KeyValue


class ClaimAction(enum.Enum):
    FRESH = "fresh"  # nothing of the job is alive: clear what is left, lead term 1
    ADOPT = "adopt"  # the job's processes run without a leader: lead it, term + 1
    REFUSE = "refuse"  # a live leader and no --standby
    WAIT = "wait"  # a live leader; --standby waits for it to go
    ENDED = "ended"  # a standby saw its leader go and nothing of the job is left


def job_alive(kvs: Sequence[KeyValue], keys: JobKeys) -> bool:
    """Whether some process of the job is alive, as the store says: a key of the job
    held by a lease that is not the leader's (a worker's registration, an agent's
    record, a shard's). Keys without a lease (plans, state, finish marks) prove
    nothing: a dead job leaves them too."""
    return any(kv.lease and kv.key != keys.driver for kv in kvs)


def claim_action(
    leader: DriverRecord | None, alive: bool, *, standby: bool, saw_leader: bool = False
) -> ClaimAction:
    """What a starting driver does (see the module docstring). ``saw_leader``: a standby
    that has already waited on a leader (a job with nothing alive then has ended)."""
    if leader is not None:
        return ClaimAction.WAIT if standby else ClaimAction.REFUSE
    if alive:
        return ClaimAction.ADOPT
    return ClaimAction.ENDED if standby and saw_leader else ClaimAction.FRESH


def read_term(value: bytes | None) -> int:
    """The newest term the term key holds (0 when absent or unreadable)."""
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


def next_term(term_value: bytes | None, leader_record: DriverRecord | None = None) -> int:
    """The term of the next leader: one above the newest the store knows of."""
    newest = read_term(term_value)
    if leader_record is not None:
        newest = max(newest, leader_record.term)
    return newest + 1


def term_bytes(term: int) -> bytes:
    return str(term).encode()


def fence(keys: JobKeys, record: DriverRecord) -> list[Compare]:
    """The compares that hold exactly while ``record`` is the job's leader."""
    return [Compare(keys.driver, "value", "==", record.to_json())]


class FenceFailure(enum.Enum):
    LOST = "lost"  # another driver leads
    RETAKE = "retake"  # nobody leads: our lease lapsed; take the key again


def after_failed_fence(
    holder: DriverRecord | None, ours: DriverRecord, newest_term: int
) -> FenceFailure:
    """What a failed fence means: another leader (or a newer term than ours) is a lost
    lead; an empty seat at our own term is our lapsed lease, to take again."""
    if holder is not None and holder != ours:
        return FenceFailure.LOST
    if newest_term > ours.term:
        return FenceFailure.LOST
    return FenceFailure.RETAKE


def describe_leader(record: DriverRecord) -> str:
    """``driver pid P on host H (term N)``."""
    return f"driver pid {record.pid} on host {record.host} (term {record.term})"


def lost_reason(job_id: str, holder: DriverRecord | None, ours: DriverRecord) -> str:
    """The one line a driver that lost the lead exits with, naming the new leader."""
    who = describe_leader(holder) if holder is not None else "a driver of a newer term"
    return (
        f"this driver (term {ours.term}) no longer leads job {job_id!r}: {who} took over; "
        "it steers nothing more and leaves the job's processes to the new leader"
    )


def keys_deleted_reason(job_id: str, ours: DriverRecord) -> str:
    """The one line a driver exits with when its job's keys, the leader term included,
    were deleted from the store by someone else (nobody took over: there is no job left
    in the store to lead)."""
    return (
        f"this driver (term {ours.term}) no longer leads job {job_id!r}: the job's keys "
        "were deleted from the store by someone else (no driver took over); it steers "
        "nothing more"
    )
