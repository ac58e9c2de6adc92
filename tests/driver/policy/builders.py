"""What the rules' tests build their cases from: hosts, the configuration and its
slices, worker records, plans, the hosts' view; and how they read decisions back."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from driver.config import JobConfig, parse_args
from driver.hosts.slots import HostSlots, parse_host_slots
from driver.policy.decisions import HostsView
from driver.policy.lifecycle import WorkerRecord, WorkerState
from driver.policy.planner import build_plan
from driver.policy.reports import ProgressSettings
from driver.policy.rounds import RoundSettings
from rendezvous.schema.rounds import Plan
from rendezvous.schema.workers import WorkerInfo

S = WorkerState


def hs(spec: str) -> tuple[HostSlots, ...]:
    return tuple(parse_host_slots(e, 1) for e in spec.split(",")) if spec else ()


def config(*args: str, **changes: Any) -> JobConfig:
    cfg = parse_args([*args, "python", "train.py"])
    return dataclasses.replace(cfg, **changes) if changes else cfg


def settings(*args: str, **changes: Any) -> RoundSettings:
    """The round rules' slice of the configuration the flags ``args`` give."""
    return RoundSettings.from_config(config(*args, **changes))


def progress(*args: str) -> ProgressSettings:
    """The progress rules' slice of the configuration the flags ``args`` give (with
    ``-np 1``: the size does not matter to them)."""
    return ProgressSettings.from_config(config("-np", "1", *args))


def info(wid: str, host: str = "h", slot: int = 0) -> WorkerInfo:
    return WorkerInfo(worker_id=wid, host=host, slot=slot, pid=1, address=f"{host}:{7000 + slot}")


def rec(
    wid: str,
    slot: int = 0,
    state: WorkerState = S.REGISTERED,
    host: str = "h",
    seq: int = 0,
    since: float = 0.0,
    launched_at: float = 0.0,
    exit_code: int | None = None,
) -> WorkerRecord:
    registered = state is S.REGISTERED
    return WorkerRecord(
        wid,
        host,
        slot,
        launched_at=launched_at,
        state=state,
        since=since,
        info=info(wid, host, slot) if registered else None,
        registered_seq=seq or (slot + 1 if registered else 0),
        exit_code=exit_code,
    )


def table(*records: WorkerRecord) -> dict[str, WorkerRecord]:
    return {r.worker_id: r for r in records}


def plan_of(round_id: int, *records: WorkerRecord) -> Plan:
    return build_plan(round_id, [info(r.worker_id, r.host, r.slot) for r in records])


def view(spec: str = "h:2", **kw: Any) -> HostsView:
    return HostsView(usable=hs(spec), **kw)


def kinds(decisions: Any) -> list[type]:
    return [type(d) for d in decisions]


D = TypeVar("D")


def only(decisions: Any, cls: type[D]) -> D:
    """The one decision, which must be a ``cls``."""
    assert kinds(decisions) == [cls], decisions
    return decisions[0]
