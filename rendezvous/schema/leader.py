"""The records of the driver that leads a job: who leads, of which term
(``DriverRecord``), and what a successor needs to go on as if nothing happened
(``DriverStateRecord``, with its hosts in cooldown as ``BlacklistEntry``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rendezvous.schema.record import JsonRecord


@dataclass(frozen=True)
class DriverRecord(JsonRecord):
    """The driver that leads a job, under ``JobKeys.driver`` and the driver's lease (so
    it vanishes when the driver is gone). ``driver_id`` is unique per driver process;
    ``started`` is a unix time; ``term`` numbers the job's successive leaders (1 for the
    driver that started the job): a plan or command from an older term than the
    leader's is stale."""

    driver_id: str
    host: str
    pid: int
    started: float
    term: int = 1


@dataclass(frozen=True)
class BlacklistEntry(JsonRecord):
    """A blacklisted host in ``DriverStateRecord``: its strikes so far and the unix time
    its cooldown ends (wall clock: a successor on another host has its own monotonic
    clock)."""

    host: str
    strikes: int
    until: float


@dataclass(frozen=True)
class DriverStateRecord(JsonRecord):
    """What the leader of ``term`` knows that the store does not otherwise say, under
    ``JobKeys.driver_state`` (written by the leader when it changes, fenced): what a
    successor needs to go on as if nothing happened.

    ``resets``/``failure_streak``: the round rules' counters; ``blacklist``: hosts in
    their cooldown, with strikes (``BlacklistEntry`` as lists ``[host, strikes, until]``);
    ``strikes``: every host's strikes (``[host, n]``), cooldowns ended included;
    ``done_slots``: ``[host, slot]`` whose worker finished; ``training_done``: a member's
    training function returned; ``launched``: the worker-id sequence (ids are never
    reused); ``given_up``: ``[worker_id, state]`` of workers the leader was stopping or
    killing (a successor must not take them back); ``secret_id``: a fingerprint of the
    job secret (never the secret), so a successor launching with another is refused;
    ``written``: unix time."""

    term: int
    resets: int = 0
    failure_streak: int = 0
    blacklist: list = field(default_factory=list)
    strikes: list = field(default_factory=list)
    done_slots: list = field(default_factory=list)
    training_done: bool = False
    launched: int = 0
    given_up: list = field(default_factory=list)
    secret_id: str = ""
    written: float = 0.0
