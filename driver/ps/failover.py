"""Whether a shard's backup takes the shard over when its primary dies (``--ps-replicas
1``), decided from the shard's ``ReplicaRecord`` (pure).

The backup takes over only while the record names it in step with the primary that
died: then it holds every update that primary acknowledged. The supervisor writes the
record this returns with a compare-and-swap on the revision it read, so a primary that
dropped its backup just before dying (its own compare-and-swap on the same record) wins
or loses against the promotion, never both; when the promotion loses, or there is no
backup in step, the shard restarts from the newest checkpoint instead.
"""

from __future__ import annotations

from rendezvous.schema.ps import ReplicaRecord


def promotion(
    record: ReplicaRecord | None, dead: str | None, backup: str | None
) -> ReplicaRecord | None:
    """The record that gives the shard to its backup at address ``backup`` after its
    primary at ``dead`` died (``serving`` False until the backup took over), or None
    when that backup is not in step with that primary."""
    if record is None or not dead or not backup or not record.serving:
        return None
    if record.primary != dead or record.backup != backup:
        return None
    return ReplicaRecord(record.index, backup, "", record.step, serving=False)
