"""A job's agent keys read back (``read_agent_keys``): what a driver taking the job
over learns of the agents a predecessor started and of what they run (pure)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rendezvous.keys import JobKeys
from rendezvous.schema.agents import AgentRecord, Assignment, ProcessStatus
from rendezvous.store import KeyValue

log = logging.getLogger(__name__)


def read_agent_keys(
    keys: JobKeys, kvs: Sequence[KeyValue]
) -> tuple[dict[str, AgentRecord], dict[str, tuple[str, Assignment]], dict[str, ProcessStatus]]:
    """The agents' records by host, the assignments by process id (with their host)
    and the process statuses by process id, from the job's keys ``kvs``; an unreadable
    record is logged and skipped (one bad key must not stop a takeover)."""
    agents: dict[str, AgentRecord] = {}
    assignments: dict[str, tuple[str, Assignment]] = {}
    statuses: dict[str, ProcessStatus] = {}
    assigned_prefix = f"{keys.prefix}assign/"
    for kv in kvs:
        try:
            if kv.key.startswith(keys.agents):
                record = AgentRecord.from_json(kv.value)
                agents[record.host] = record
            elif kv.key.startswith(assigned_prefix):
                assignment = Assignment.from_json(kv.value)
                host = kv.key[len(assigned_prefix) :].split("/", 1)[0].replace("%2F", "/")
                assignments[assignment.id] = (host, assignment)
            elif kv.key.startswith(keys.processes):
                status = ProcessStatus.from_json(kv.value)
                statuses[status.id] = status
        except (ValueError, TypeError) as exc:
            log.warning("unreadable record %s: %s", kv.key, exc)
    return agents, assignments, statuses
