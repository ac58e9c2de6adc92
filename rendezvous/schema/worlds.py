"""The records of restart mode's worlds (``elastic-run --restart-workers``): where rank
0 serves torch's c10d store (``WorldMaster``) and the seat a warm spare is given
(``WorldSeat``)."""

from __future__ import annotations

from dataclasses import dataclass

from rendezvous.schema.record import JsonRecord


@dataclass(frozen=True)
class WorldMaster(JsonRecord):
    """Where rank 0 of world ``world`` (``elastic-run --restart-workers``) serves torch's
    c10d store: ``address`` (its address toward the job's store) and ``port`` (free on
    its host when it was chosen), under ``JobKeys.world_master``; ``host`` is its host
    as the driver names it."""

    world: int
    address: str
    port: int
    host: str = ""


@dataclass(frozen=True)
class WorldSeat(JsonRecord):
    """A seat of world ``world`` given to a warm spare of restart mode, under
    ``JobKeys.world_seat``: ``variables``, what a worker started in that seat is told
    (its ranks and the world's sizes, as torchrun names them, and the job's own
    variables for meeting rank 0)."""

    world: int
    variables: dict[str, str]
