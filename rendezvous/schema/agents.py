"""The records of the per-host agents (``driver.agent``) in the store.

* ``AgentRecord`` under ``JobKeys.agent(host)``, under the agent's own lease: the
  agent of a host is alive while it exists;
* ``Assignment`` under ``JobKeys.assignment(host, id)``: one process the leader wants
  the host to run (or stop, or kill), stamped with the leader's ``term``;
* ``ProcessStatus`` under ``JobKeys.process(host, id)``: written by the agent when the
  process starts and when it ends.

``leader_term`` reads the leader's term from the leader record (``JobKeys.driver``):
the one place an agent or the driver's agent side learns the current term.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from rendezvous.schema.leader import DriverRecord
from rendezvous.schema.record import JsonRecord

AGENT_LEASE_TTL = 3.0
"""Seconds an agent's record outlives an agent that stopped refreshing it: how soon the
driver knows a host whose agent died or was cut off is lost."""

RETURN_GRACE = 15.0
"""Seconds a record whose lease lapsed while the store was in trouble (an agent's, a
worker's registration) has to be written again, counted from when the store is out of
trouble, before the driver counts its loss (``driver.policy.lapses``)."""

KINDS = ("worker", "shard")
WANTS = ("run", "stop", "kill")
RUNNING = "running"
EXITED = "exited"


@dataclass(frozen=True)
class AgentRecord(JsonRecord):
    """The agent of ``host``: its ``pid`` (on that host), when it ``started`` (unix
    time), the highest leader term it has seen, the file its output also goes to
    (``log_path``, "" when none: a driver that takes over may read it there), and the
    ``agent_id`` its starter gave it (so the starter knows its own agent's record);
    ``slots``: the slots a node that joined the job (``elastic-run --join``) offers, 0
    for an agent a driver started; ``draining``: the agent got SIGTERM and leaves once
    its processes are gone (its record's end is then no lost host)."""

    host: str
    pid: int
    started: float
    term_seen: int = 0
    log_path: str = ""
    agent_id: str = ""
    slots: int = 0
    draining: bool = False


@dataclass(frozen=True)
class Assignment:
    """One process the leader of term ``term`` wants on a host.

    ``id`` is unique in the job (a replacement gets a new one); ``kind`` is "worker" or
    "shard"; ``env`` holds the job's own variables for it (never the job's secret: the
    agent has it and passes it on); ``cwd`` "" means the agent's; ``log_path`` "" means
    none. ``want``: "run" (start it once), "stop" (SIGTERM, SIGKILL after ``grace``
    seconds) or "kill" (SIGKILL).

    Raises (when made):
        ValueError: an unknown ``kind`` or ``want``, or an empty command.
    """

    id: str
    kind: str
    slot: int
    command: tuple[str, ...]
    term: int
    env: dict[str, str] = field(default_factory=dict, hash=False)
    cwd: str = ""
    label: str = ""
    log_path: str = ""
    want: str = "run"
    grace: float = 5.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"assignment {self.id}: kind {self.kind!r} is not one of {KINDS}")
        if self.want not in WANTS:
            raise ValueError(f"assignment {self.id}: want {self.want!r} is not one of {WANTS}")
        if not self.command:
            raise ValueError(f"assignment {self.id}: empty command")
        object.__setattr__(self, "command", tuple(self.command))

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Assignment:
        """Raises: ValueError (also ``json.JSONDecodeError``, ``TypeError`` as
        ValueError) for a record that does not parse."""
        try:
            raw = json.loads(data)
            known = {f: raw[f] for f in cls.__dataclass_fields__ if f in raw}
            return cls(**known)
        except (TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"unreadable assignment: {exc}") from None


@dataclass(frozen=True)
class ProcessStatus(JsonRecord):
    """How process ``id`` of ``host`` runs (``state`` "running", with its ``pid``) or
    ended ("exited", with ``code``: negative -N for signal N; ``error`` says why it
    could not start, ``permanent`` when no try would). Times are unix times; ``term`` is
    the highest leader term the agent had seen when it wrote this."""

    id: str
    host: str
    pid: int
    state: str
    started: float
    term: int = 0
    code: int | None = None
    ended: float = 0.0
    error: str = ""
    permanent: bool = False

    @property
    def exited(self) -> bool:
        return self.state == EXITED


def leader_term(value: bytes | None) -> int | None:
    """The term of the leader record ``value`` (the value of ``JobKeys.driver``), None
    when there is no leader (or its record does not parse)."""
    if not value:
        return None
    try:
        return DriverRecord.from_json(value).term
    except (ValueError, TypeError):
        return None
